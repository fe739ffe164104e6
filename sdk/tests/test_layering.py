"""The core's internal layers (docs/design.md#core-layers), checked with ``ast`` on the source.

- No core module is over `MAX_LINES` lines, Triton kernel files aside (`exempt_from_size`).
- The packages and top-level modules of ``opcore`` import one another without a cycle,
  counting every import statement wherever it is (inside functions too) and
  ``importlib.import_module`` / ``__import__`` of a literal name; imports under
  ``if TYPE_CHECKING:`` are left out, since they never run.
- Every such import points down the levels docs/design.md draws, so the drawing and the code
  cannot drift apart.
- ``opcore.ir.op`` is imported only inside ``opcore.ir`` (elsewhere: the names ``opcore.ir``
  and ``opcore.ir.dispatch`` export).
- ``opcore.config`` imports nothing of layers, attention, platforms, ir or tuning, and the
  tuning index (``opcore.tuning``) nothing of ir, config, settings, platforms or bench;
  these two also in a fresh interpreter (what importing them loads).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from opcore.testing import run_python

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "sdk" / "src" / "opcore"
DESIGN = ROOT / "docs" / "design.md"
# The cookiecutter tree is a plugin's sources with Jinja in its names (test_design_rules.py).
TEMPLATE_TREE = CORE / "templates" / "plugin" / "{{cookiecutter.__project_slug}}"
MAX_LINES = 700


@dataclasses.dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. "opcore.ir.dispatch"
    target: str  # the module imported, e.g. "opcore.settings"
    line: int
    type_checking: bool  # under ``if TYPE_CHECKING:`` (never runs)

    def where(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}"


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def python_files(package: Path) -> list[Path]:
    return sorted(
        p
        for p in package.rglob("*.py")
        if not p.is_relative_to(TEMPLATE_TREE) and "__pycache__" not in p.parts
    )


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def imports_of(path: Path, src: Path, known: set[str]) -> list[Import]:
    """Every module ``path`` imports: import statements at any depth (relative ones
    resolved), ``importlib.import_module("x")`` and ``__import__("x")``. ``from a import b``
    counts as importing ``a.b`` when that is a module of ``known``, else ``a``."""
    me = module_name(path, src)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: list[Import] = []

    def absolute(module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = package.split(".")[: len(package.split(".")) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(me, a.name, node.lineno, type_checking) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node.module, node.level)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in known else base
                found.append(Import(me, target, node.lineno, type_checking))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if (
                name in ("import_module", "__import__")
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
            ):
                found.append(Import(me, arg.value, node.lineno, type_checking))
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False)
    return found


def scan(package: Path) -> tuple[dict[str, Path], list[Import]]:
    """The modules of ``package`` (a source folder whose parent is on ``sys.path``) and
    every import they make."""
    src = package.parent
    modules = {module_name(p, src): p for p in python_files(package)}
    known = set(modules)
    return modules, [i for p in modules.values() for i in imports_of(p, src, known)]


def unit(module: str) -> str:
    """The package or top-level module of ``opcore`` that ``module`` belongs to (the
    graph's node): ``opcore.ir.dispatch`` -> ``opcore.ir``; ``opcore`` is its own."""
    return ".".join(module.split(".")[:2])


def unit_edges(imports: Iterable[Import], root: str = "opcore") -> dict[tuple[str, str], Import]:
    """``(from unit, to unit) -> one import making it``, for imports that run (not under
    TYPE_CHECKING) between two different units of ``root``."""
    edges: dict[tuple[str, str], Import] = {}
    for i in imports:
        if i.type_checking or i.target.split(".")[0] != root:
            continue
        a, b = unit(i.module), unit(i.target)
        if a != b:
            edges.setdefault((a, b), i)
    return edges


def find_cycle(edges: Iterable[tuple[str, str]]) -> list[str] | None:
    """A cycle of the directed graph ``edges`` as ``[a, b, ..., a]``, or ``None``."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)):
            return cycle
    return None


# --------------------------------------------------------------------------- the scanner
def test_the_scan_sees_function_level_dynamic_and_relative_imports(tmp_path):
    pkg = tmp_path / "opcore"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "low" / "leaf.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from opcore.high import Thing\n"
        "def f():\n"
        "    import importlib\n"
        "    return importlib.import_module('opcore.high.deep')\n"
    )
    (pkg / "high.py").write_text("def g():\n    from opcore.low import leaf\n")
    modules, imports = scan(pkg)
    assert set(modules) == {"opcore", "opcore.low", "opcore.low.leaf", "opcore.high"}
    found = {(i.module, i.target, i.type_checking) for i in imports}
    assert ("opcore.low", "opcore.low.leaf", False) in found  # relative, resolved
    assert ("opcore.low.leaf", "opcore.high", True) in found  # TYPE_CHECKING: marked
    assert ("opcore.low.leaf", "opcore.high.deep", False) in found  # import_module literal
    assert ("opcore.high", "opcore.low.leaf", False) in found  # inside a function
    # The function-level and dynamic imports make a cycle; the TYPE_CHECKING one alone
    # would not have.
    edges = unit_edges(imports)
    assert set(edges) == {("opcore.low", "opcore.high"), ("opcore.high", "opcore.low")}
    assert find_cycle(edges) in (
        ["opcore.high", "opcore.low", "opcore.high"],
        ["opcore.low", "opcore.high", "opcore.low"],
    )


def test_the_cycle_finder_finds_a_long_cycle_and_none_in_a_dag():
    chain = [(f"n{i}", f"n{i + 1}") for i in range(28)]
    assert find_cycle(chain) is None
    cycle = find_cycle([*chain, ("n28", "n0")])
    assert cycle is not None and cycle[0] == cycle[-1] and len(cycle) == 30


# --------------------------------------------------------------------------- sizes
def _defines_triton_jit(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if ast.unparse(target) in ("triton.jit", "jit"):
                    return True
    return False


# Kernel files: Triton kernels are long straight-line functions with their launch code
# beside them, and splitting one across modules would split what a provider's identity
# hash covers (docs/tuning.md).
KERNEL_FOLDERS = (CORE / "kernels" / "triton", CORE / "attention" / "backends")


def exempt_from_size(path: Path) -> bool:
    """Exempt from `MAX_LINES`: a module of ``opcore/kernels/triton/`` or
    ``opcore/attention/backends/`` that defines a ``@triton.jit`` kernel."""
    return path.parent in KERNEL_FOLDERS and _defines_triton_jit(path)


def test_the_size_exemption_covers_the_triton_kernel_files_only():
    exempt = {p.relative_to(CORE).as_posix() for p in python_files(CORE) if exempt_from_size(p)}
    assert {"kernels/triton/norm.py", "attention/backends/_triton_kernels.py"} <= exempt
    # their launch and registration code, the backend class: not kernels, not exempt
    assert not exempt & {
        "kernels/triton/_register.py",
        "kernels/triton/_launch.py",
        "attention/backends/triton_paged.py",
    }
    assert all(p.startswith(("kernels/triton/", "attention/backends/")) for p in exempt)


def test_no_core_module_is_over_700_lines():
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in python_files(CORE)
        if not exempt_from_size(p)
    }
    assert len(sizes) > 100
    over = {p: n for p, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not over, f"split these (docs/design.md#core-layers): {over}"


# --------------------------------------------------------------------------- the import graph
@pytest.fixture(scope="module")
def core():
    return scan(CORE)


def test_no_import_cycle_across_the_core_s_packages(core):
    modules, imports = core
    edges = unit_edges(imports)
    nodes = {a for a, _ in edges} | {b for _, b in edges}
    assert {"opcore.config", "opcore.ir", "opcore.layers", "opcore.tuning"} <= nodes
    cycle = find_cycle(edges)
    assert cycle is None, (
        "import cycle across opcore's packages (function-level imports count):\n"
        + "\n".join(edges[(a, b)].where() for a, b in zip(cycle, cycle[1:], strict=False))
    )


def design_levels() -> dict[str, int]:
    """``{unit: level}`` from the table under docs/design.md#core-layers."""
    text = DESIGN.read_text(encoding="utf-8")
    start = text.index('<a id="core-layers"></a>')
    end = text.find("\n## ", start)
    levels: dict[str, int] = {}
    for row in re.findall(r"^\| (\d+) \| ([^|]+) \|", text[start:end], flags=re.M):
        for name in re.findall(r"`([\w.]+)`", row[1]):
            assert name not in levels, f"{name} is on two levels of docs/design.md#core-layers"
            levels[name] = int(row[0])
    return levels


def test_every_import_points_down_the_levels_design_md_draws(core):
    modules, imports = core
    levels = design_levels()
    units = {unit(m) for m in modules}
    assert units == set(levels), (
        f"docs/design.md#core-layers lacks {sorted(units - set(levels))}, "
        f"names what is not there: {sorted(set(levels) - units)}"
    )
    upward = [
        f"{i.where()} (level {levels[a]} -> {levels[b]})"
        for (a, b), i in sorted(unit_edges(imports).items())
        if levels[a] <= levels[b]
    ]
    assert not upward, (
        "a package imports one on its own level or above (docs/design.md#core-layers): "
        "move the code to the layer it belongs to, or let the upper layer register with "
        "the lower one:\n" + "\n".join(upward)
    )


def _project_modules() -> Iterable[tuple[Path, Path]]:
    """Every non-test source file of the project with its import root: the core, the
    conformance suite, the plugins and the bench scripts."""
    for path in python_files(CORE):
        yield path, CORE.parent
    for src in [ROOT / "conformance" / "src", *sorted((ROOT / "plugins").glob("*/src"))]:
        for path in sorted(src.rglob("*.py")):
            yield path, src
    for path in sorted((ROOT / "bench").glob("*.py")):
        yield path, ROOT / "bench"


def test_opcore_ir_op_is_imported_only_inside_opcore_ir():
    known = set(scan(CORE)[0])
    bad = []
    for path, src in _project_modules():
        for i in imports_of(path, src, known):
            inside = i.module == "opcore.ir" or i.module.startswith("opcore.ir.")
            if i.target == "opcore.ir.op" and not inside:
                bad.append(f"{path.relative_to(ROOT)}:{i.line}")
    bad = sorted(set(bad))
    assert not bad, (
        "opcore.ir.op is ir's own: import IrOp, Impl, register_op, get_op, all_ops from "
        "opcore.ir, the generation API (bump_generation, registry_generation, "
        "PRIORITY_SCOPE, is_tracing) from opcore.ir.dispatch:\n" + "\n".join(bad)
    )


def _offenders(core, package: str, forbidden: tuple[str, ...]) -> list[str]:
    """Imports of ``forbidden`` packages by ``package``'s modules, TYPE_CHECKING ones too."""
    _modules, imports = core
    return [i.where() for i in imports if unit(i.module) == package and unit(i.target) in forbidden]


CONFIG_MUST_NOT_LOAD = (
    "opcore.layers",
    "opcore.attention",
    "opcore.platforms",
    "opcore.ir",
    "opcore.tuning",
    "opcore.settings",
)
TUNING_MUST_NOT_LOAD = (
    "opcore.ir",
    "opcore.config",
    "opcore.settings",
    "opcore.platforms",
    "opcore.bench",
)


def _loaded_by(module: str, forbidden: tuple[str, ...]) -> list[str]:
    """The modules of ``forbidden`` packages that importing ``module`` loads, in a fresh
    interpreter."""
    code = (
        f"import json, sys, {module}; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'opcore' "
        f"and '.'.join(m.split('.')[:2]) in {list(forbidden)!r})))"
    )
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_opcore_config_imports_nothing_of_the_layers_above_it(core):
    bad = _offenders(core, "opcore.config", CONFIG_MUST_NOT_LOAD)
    assert not bad, "opcore.config is a leaf value (docs/design.md#core-layers):\n" + "\n".join(bad)
    assert _loaded_by("opcore.config", CONFIG_MUST_NOT_LOAD) == []


def test_the_tuning_index_imports_nothing_of_ir_config_platforms_or_bench(core):
    bad = _offenders(core, "opcore.tuning", TUNING_MUST_NOT_LOAD)
    assert not bad, (
        "the tuning index sits below ir: opcore.ir.tuning_sources hands it what it reads "
        "(docs/design.md#core-layers):\n" + "\n".join(bad)
    )
    assert _loaded_by("opcore.tuning", TUNING_MUST_NOT_LOAD) == []
