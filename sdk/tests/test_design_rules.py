"""The rules docs/design.md states, checked on the source tree.

- Dependencies point one way (docs/design.md#layers-and-imports): no module of the core
  (sdk/src/opcore) imports the conformance suite or a plugin, no plugin imports another
  plugin or the conformance suite, the conformance suite imports no plugin. Every import
  statement counts, wherever it is (module level, inside a function, under
  ``TYPE_CHECKING``), and so does ``importlib.import_module`` / ``__import__`` of a literal
  name.
- The design the code cites is in the repository: no citation of the wave-1 document
  outside it, and every ``docs/design.md#<anchor>`` cited anywhere names an anchor that
  docs/design.md has.
- The doc covers what it promises: every built-in op, the resolution rules with the numbers
  the resolver's docstring and docs/platforms.md use.
- The core names no vendor in code (docs/design.md#layers-and-imports): no ``torch.cuda``
  and no ``.type == "cuda"`` branch in sdk/src/opcore outside the Triton kernels' own
  device checks; device work goes through the current platform.
- Plugin API 1.x's forward route is gone from sdk, conformance, plugins and docs: none
  names the vendor forward methods or the 1.x platform forward chain (issue #14).
"""

from __future__ import annotations

import ast
import os
import re
import unicodedata
from pathlib import Path

import pytest

import opcore.ir.ops

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "sdk" / "src" / "opcore"
DESIGN = ROOT / "docs" / "design.md"
# The cookiecutter tree renders into a new plugin's own distribution (Jinja in its names and
# sources): it is plugin code, checked as the rendered plugin by the template's tests.
TEMPLATE_TREE = CORE / "templates" / "plugin" / "{{cookiecutter.__project_slug}}"

# Directories that are not the project's sources: build outputs, environments, caches, the
# site, recorded reports, carried wheels.
_SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    "build",
    "dist",
    "site",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".whl",
    "opcore-reports",
    "node_modules",
}
_TEXT_SUFFIXES = {
    ".py",
    ".md",
    ".toml",
    ".yml",
    ".yaml",
    ".txt",
    ".cfg",
    ".ini",
    ".json",
    ".sh",
    ".rst",
}


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every absolute module name ``path`` imports, with its line: import statements
    anywhere in the file, and ``importlib.import_module("x")`` / ``__import__("x")``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                if isinstance(arg.value, str):
                    found.append((node.lineno, arg.value))
    return found


def _python_files(folder: Path, exclude: Path | None = None) -> list[Path]:
    files = []
    for path in sorted(folder.rglob("*.py")):
        parts = set(path.relative_to(folder).parts)
        if parts & _SKIP_DIRS or (exclude is not None and path.is_relative_to(exclude)):
            continue
        files.append(path)
    return files


def _offenders(files: list[Path], forbidden) -> list[str]:
    out = []
    for path in files:
        for line, module in _imported_modules(path):
            top = module.split(".")[0]
            if forbidden(top):
                out.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return out


def test_the_scan_sees_lazy_and_dynamic_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import opcore_plugin_a\n"
        "def f():\n"
        "    from opcore_conformance.checks import numerics\n"
        "    import importlib\n"
        "    return importlib.import_module('opcore_plugin_b.platform')\n",
        encoding="utf-8",
    )
    names = {name for _, name in _imported_modules(module)}
    assert {"opcore_plugin_a", "opcore_conformance.checks", "opcore_plugin_b.platform"} <= names


def test_the_core_imports_no_plugin_and_no_sibling_distribution():
    files = _python_files(CORE, exclude=TEMPLATE_TREE)
    assert len(files) > 50 and CORE / "cli" / "commands.py" in files
    bad = _offenders(
        files, lambda top: top == "opcore_conformance" or top.startswith("opcore_plugin_")
    )
    assert not bad, "the core must not import these (docs/design.md#layers-and-imports):\n" + (
        "\n".join(bad)
    )


def test_plugins_import_no_other_plugin_and_no_conformance_suite():
    plugins = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "src").is_dir())
    assert len(plugins) >= 6
    bad = []
    for plugin in plugins:
        own = f"opcore_plugin_{plugin.name}"
        bad += _offenders(
            _python_files(plugin / "src"),
            lambda top, own=own: (
                top == "opcore_conformance" or (top.startswith("opcore_plugin_") and top != own)
            ),
        )
    assert not bad, "\n".join(bad)


def test_the_conformance_suite_imports_no_plugin():
    files = _python_files(ROOT / "conformance" / "src")
    bad = _offenders(files, lambda top: top.startswith("opcore_plugin_"))
    assert not bad, "\n".join(bad)


def _project_text_files(top: Path = ROOT):
    # os.walk, pruning as it goes: the environments and build folders are large.
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(folder) / name
            if path.suffix in _TEXT_SUFFIXES:
                yield path


def test_no_citation_of_a_design_document_outside_the_repository():
    # Spelled in two parts so this file does not match itself.
    old = "DESIGN " + "\u00a7"
    bad = []
    for path in _project_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        bad += [
            f"{path.relative_to(ROOT)}:{n}"
            for n, line in enumerate(text.splitlines(), 1)
            if old in line
        ]
    assert not bad, f"cite docs/design.md#<anchor> instead of {old}N: {bad}"


# The Triton kernels may check the device they were handed (Triton drives torch's "cuda"
# device type on NVIDIA and AMD); everything else in the core asks the current platform.
_TRITON_KERNELS = (
    CORE / "kernels" / "triton",
    CORE / "attention" / "backends" / "_triton_kernels.py",
    CORE / "attention" / "backends" / "triton_paged.py",
)
_VENDOR_BRANCHES = re.compile(
    r"\btorch\.cuda\b"  # torch.cuda.synchronize(), import torch.cuda
    r"|\bfrom\s+torch\s+import\s+[^\n]*\bcuda\b"
    r"|\.type\s*[!=]=\s*['\"]cuda['\"]"  # device.type == "cuda"
    r"|\.is_cuda\b"
)


def _vendor_branches(files: list[Path]) -> list[str]:
    out = []
    for path in files:
        if any(path.is_relative_to(allowed) for allowed in _TRITON_KERNELS):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _VENDOR_BRANCHES.search(line):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                out.append(f"{where}:{n}: {line.strip()}")
    return out


def test_the_vendor_branch_scan_sees_each_form(tmp_path):
    lines = [
        "torch.cuda.synchronize()",
        "import torch.cuda",
        "from torch import cuda, nn",
        'if x.device.type == "cuda":',
        "if t.device.type != 'cuda':",
        "if t.is_cuda:",
    ]
    for i, line in enumerate(lines):
        (tmp_path / f"m{i}.py").write_text(line + "\n", encoding="utf-8")
    (tmp_path / "clean.py").write_text('device_type = "cuda"  # a name, not a branch\n')
    found = _vendor_branches(sorted(tmp_path.glob("*.py")))
    assert len(found) == len(lines) and not any("clean.py" in f for f in found)


def test_the_core_has_no_cuda_branch_outside_the_triton_kernels():
    files = _python_files(CORE, exclude=TEMPLATE_TREE)
    bad = _vendor_branches(files)
    assert not bad, (
        "the core names no vendor: use the current platform (synchronize, empty_cache, "
        "device queries) instead (docs/design.md#layers-and-imports):\n" + "\n".join(bad)
    )


def test_no_source_or_doc_names_the_1x_forward_route():
    # Spelled in parts so this file does not match itself.
    retired = [
        "forward_" + "cuda",
        "forward_" + "hip",
        "forward_" + "xpu",
        "custom_op_" + "forward_chain",
    ]
    bad = []
    for top in ("sdk", "conformance", "plugins", "docs"):
        for path in _project_text_files(ROOT / top):
            text = path.read_text(encoding="utf-8", errors="replace")
            for n, line in enumerate(text.splitlines(), 1):
                bad += [f"{path.relative_to(ROOT)}:{n}: {name}" for name in retired if name in line]
    assert not bad, (
        "plugin API 2.0 has one kernel route (docs/design.md#plugin-api-2-0); describe the 1.x "
        "route without its names:\n" + "\n".join(bad)
    )


def _slug(heading: str) -> str:
    # Python-Markdown's toc slugify, which mkdocs uses for heading ids.
    value = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def _design_anchors() -> set[str]:
    text = DESIGN.read_text(encoding="utf-8")
    explicit = set(re.findall(r'<a id="([^"]+)"></a>', text))
    headings = {_slug(h) for h in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M)}
    return explicit | headings


def test_every_cited_design_anchor_exists():
    anchors = _design_anchors()
    assert "plugin-api-2-0" in anchors
    cited = {}
    for path in _project_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for anchor in re.findall(r"design\.md#([A-Za-z0-9_-]+)", text):
            cited.setdefault(anchor, path.relative_to(ROOT).as_posix())
    assert cited, "nothing cites docs/design.md#..."
    missing = {a: where for a, where in cited.items() if a not in anchors}
    assert not missing, f"anchors cited but not in docs/design.md: {missing}"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def _numbered(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^\s*(\d+)\. ", text, flags=re.M)]


def test_the_resolution_rules_have_the_same_numbers_everywhere():
    design = _numbered(_section(DESIGN.read_text(encoding="utf-8"), "## Resolution rules"))
    resolver = (CORE / "platforms" / "resolution.py").read_text(encoding="utf-8")
    docstring = ast.get_docstring(ast.parse(resolver)) or ""
    platforms = _section(
        (ROOT / "docs" / "platforms.md").read_text(encoding="utf-8"), "## The resolution rules"
    )
    assert design[:1] == [1] and design == list(range(1, len(design) + 1))
    assert _numbered(docstring) == design
    assert _numbered(platforms) == design


@pytest.mark.parametrize("op", opcore.ir.ops.__all__)
def test_the_design_lists_every_built_in_op_with_its_definition(op):
    text = DESIGN.read_text(encoding="utf-8")
    row = next((line for line in text.splitlines() if line.startswith(f"| `{op}` |")), None)
    assert row, f"docs/design.md has no row for op {op}"
    defined_in = re.search(r"`(sdk/src/opcore/ir/ops/[\w/]+\.py)`", row)
    assert defined_in and (ROOT / defined_in.group(1)).is_file(), row
    source = (ROOT / defined_in.group(1)).read_text(encoding="utf-8")
    assert re.search(rf"^def {op}\(", source, flags=re.M), f"{op} is not defined where the doc says"
