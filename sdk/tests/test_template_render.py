"""The plugin template renders cleanly for every option, and bad answers are refused.

Rendering is the real cookiecutter, in this process (hooks run as cookiecutter runs them);
installing and running what it renders is test_template_install.py, the wheel
test_template_wheel.py.
"""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opcore
from opcore import templates, version_policy
from opcore.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
EXPECTED_FILES = {
    ".ci/run",
    ".gitignore",
    "README.md",
    "pyproject.toml",
    "src/opcore_plugin_{name}/__init__.py",
    "src/opcore_plugin_{name}/attention.py",
    "src/opcore_plugin_{name}/expectations.toml",
    "src/opcore_plugin_{name}/layers.py",
    "src/opcore_plugin_{name}/platform.py",
    "src/opcore_plugin_{name}/providers.py",
    "src/opcore_plugin_{name}/py.typed",
    "tests/test_{name}_attention.py",
    "tests/test_{name}_conformance.py",
    "tests/test_{name}_plugin.py",
}
MARKERS = ("{{", "}}", "{%", "%}", "{#", "cookiecutter")
ODD_VENDOR = "Ünïcode O'Vendor & Söhne GmbH"


def files_of(project: Path) -> dict[str, str]:
    return {
        p.relative_to(project).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(project.rglob("*"))
        if p.is_file()
    }


def assert_clean(project: Path, name: str) -> dict[str, str]:
    """Exactly the expected files, no template syntax or template-tool names anywhere."""
    files = files_of(project)
    assert set(files) == {f.format(name=name) for f in EXPECTED_FILES}
    for rel, text in files.items():
        for marker in MARKERS:
            assert marker not in rel, f"{rel}: path holds {marker!r}"
            assert marker not in text, f"{rel}: holds {marker!r}"
    for rel, text in files.items():
        if rel.endswith(".py"):
            ast.parse(text, filename=rel)
    assert os.access(project / ".ci" / "run", os.X_OK)
    return files


@pytest.mark.parametrize(
    "name, vendor, device_type",
    [
        ("acme", None, None),
        ("acme", ODD_VENDOR, None),
        ("my_accel2", None, "npu"),
        ("my_accel2", ODD_VENDOR, "npu"),
    ],
)
def test_renders_every_option_combination(tmp_path, name, vendor, device_type):
    options = {} if device_type is None else {"device_type": device_type}
    project = templates.render_plugin(name, tmp_path, vendor=vendor, **options)
    assert project == tmp_path / f"opcore-plugin-{name}"
    files = assert_clean(project, name)

    meta = tomllib.loads(files["pyproject.toml"])
    assert meta["project"]["name"] == f"opcore-plugin-{name}"
    assert meta["project"]["authors"] == [{"name": vendor or f"The {name} authors"}]
    assert meta["project"]["dependencies"] == [version_policy.requirement()]
    assert meta["project"]["optional-dependencies"]["test"][0] == version_policy.requirement(
        name="opcore-conformance"
    )
    assert meta["project"]["entry-points"]["opcore.platform_plugins"] == {
        name: f"opcore_plugin_{name}:probe"
    }
    assert meta["tool"]["setuptools"]["package-data"] == {
        f"opcore_plugin_{name}": ["expectations.toml", "py.typed"]
    }

    device = device_type or "cpu"
    platform_src = files[f"src/opcore_plugin_{name}/platform.py"]
    assert f'device_type = "{device}"' in platform_src
    assert f'dispatch_key = "{"CPU" if device == "cpu" else "PrivateUse1"}"' in platform_src
    assert f'plugin_api = ("{opcore.PLUGIN_API_VERSION}", ' in platform_src
    assert f'DEVICE_TYPE = "{device}"' in files[f"src/opcore_plugin_{name}/providers.py"]
    env = f"OPCORE_{name.upper()}_STANDIN"
    assert f'STANDIN_ENV = "{env}"' in files[f"src/opcore_plugin_{name}/__init__.py"]
    assert env in files["README.md"]
    if vendor:
        assert vendor in files["README.md"]


def test_rendered_expectations_file_is_an_empty_valid_one(tmp_path):
    from opcore_conformance import expectations

    project = templates.render_plugin("acme", tmp_path)
    path = project / "src/opcore_plugin_acme/expectations.toml"
    parsed = expectations.load(path)
    assert parsed.entries == []
    # The schema header documents every key the suite accepts.
    text = path.read_text(encoding="utf-8")
    for key in ("match", "status", "reason", "atol", "rtol", "error_regex", "link"):
        assert f"{key} =" in text
    for status in expectations.ENTRY_STATUSES:
        assert status in text


def test_rendered_projects_pass_ruff_with_their_own_config(tmp_path):
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed")
    for name, device_type in (("acme", "cpu"), ("my_accel2", "npu")):
        project = templates.render_plugin(name, tmp_path, device_type=device_type)
        proc = subprocess.run(
            [ruff, "check", "--no-cache", "."], cwd=project, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_plain_cookiecutter_on_template_dir_renders_the_same_project(tmp_path):
    """template/ at the repository root is an entry point to the packaged template."""
    from cookiecutter.main import cookiecutter

    config = tmp_path / "cc.yaml"
    config.write_text(json.dumps({"replay_dir": str(tmp_path / "replay")}), encoding="utf-8")
    plain = cookiecutter(
        str(REPO / "template"),
        no_input=True,
        extra_context={"plugin_name": "acme"},
        output_dir=str(tmp_path / "plain"),
        config_file=str(config),
    )
    ours = templates.render_plugin("acme", tmp_path / "ours")
    assert files_of(Path(plain)) == files_of(ours)


def test_template_defaults_match_this_opcore():
    """Plain cookiecutter renders the defaults; they must be this opcore's versions."""
    context = json.loads((templates.plugin_template_dir() / "cookiecutter.json").read_text())
    assert context["__opcore_version"] == opcore.__version__
    assert context["__opcore_requirement"] == version_policy.requirement()
    assert context["__conformance_requirement"] == version_policy.requirement(
        name="opcore-conformance"
    )
    assert (context["__plugin_api_min"], context["__plugin_api_max"]) == templates._api_range()


def test_reserved_device_types_cover_every_torch_device_type():
    with pytest.raises(RuntimeError) as info:
        torch.device("not_a_device_type")
    listed = str(info.value).split("Expected one of ", 1)[1].split(" device type", 1)[0]
    torch_types = {t.strip() for t in listed.split(",")}
    assert "cuda" in torch_types and len(torch_types) > 10
    assert torch_types <= templates.name_checks().TORCH_DEVICE_TYPES


BAD_NAMES = [
    ("Acme", "not a lowercase identifier"),
    ("my-accel", "not a lowercase identifier"),
    ("1acme", "not a lowercase identifier"),
    ("a__b", "not a lowercase identifier"),
    ("acme_", "not a lowercase identifier"),
    ("", "not a lowercase identifier"),
    ("x" * 41, "at most 40"),
    ("opcore_acme", "repeats the prefix"),
    ("cuda", "taken by opcore-plugin-cuda"),
    ("cpu", "taken by opcore-plugin-cpu"),
    ("ascend", "taken by opcore-plugin-ascend"),
    ("npu", "taken by opcore-plugin-ascend"),
    ("unspecified", "fallback platform"),
    ("mps", "is a torch device type"),
    ("meta", "is a torch device type"),
    ("privateuseone", "is a torch device type"),
    ("native", "reserved"),
    ("triton", "reserved"),
]


@pytest.mark.parametrize("name, expected", BAD_NAMES)
def test_cli_refuses_a_bad_name_in_one_line(tmp_path, capsys, name, expected):
    rc = main(["new-plugin", name, "-o", str(tmp_path), "--no-input"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("opcore new-plugin: error: "), err
    assert expected in err and repr(name) in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--vendor", "Acme\tLabs", "use printable text on one line"),
        ("--vendor", "  ", "vendor is empty"),
        ("--device-type", "Not-A-Type", "not a torch device type name"),
    ],
)
def test_cli_refuses_bad_vendor_and_device_type_in_one_line(
    tmp_path, capsys, option, value, expected
):
    rc = main(["new-plugin", "acme", "-o", str(tmp_path), "--no-input", option, value])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and expected in err, err
    assert list(tmp_path.iterdir()) == []


def test_hook_refuses_a_bad_name_without_the_cli(tmp_path, capfd):
    """cookiecutter run directly on the template: the pre-generation hook is the guard."""
    from cookiecutter.exceptions import FailedHookException
    from cookiecutter.main import cookiecutter

    config = tmp_path / "cc.yaml"
    config.write_text(json.dumps({"replay_dir": str(tmp_path / "replay")}), encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(FailedHookException):
        cookiecutter(
            str(templates.plugin_template_dir()),
            no_input=True,
            extra_context={"plugin_name": "cuda"},
            output_dir=str(out),
            config_file=str(config),
        )
    hook_lines = [
        line for line in capfd.readouterr().err.splitlines() if line.startswith("ERROR: ")
    ]
    assert hook_lines == [
        "ERROR: plugin name 'cuda' is taken by opcore-plugin-cuda; name the plugin after your "
        "product or device"
    ]
    assert not out.exists() or list(out.iterdir()) == []


def test_existing_target_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "opcore-plugin-acme").mkdir()
    rc = main(["new-plugin", "acme", "-o", str(tmp_path), "--no-input"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "already exists" in err


class Terminal(io.StringIO):
    """Standard input that says it is a terminal (none exists under pytest)."""

    def isatty(self) -> bool:
        return True


def test_missing_cookiecutter_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    for module in ("cookiecutter", "cookiecutter.main", "cookiecutter.exceptions"):
        monkeypatch.setitem(
            sys.modules, module, None
        )  # what the import system does for a missing package
    # Interactive, yet nothing is asked: the missing package is reported first.
    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr("builtins.input", lambda prompt: pytest.fail(f"asked {prompt!r}"))
    rc = main(["new-plugin", "acme", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "pip install 'opcore[template]'" in err
    assert list(tmp_path.iterdir()) == []


def test_interactive_run_asks_for_vendor_and_device_type(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Terminal())
    answers = iter(["Acme Labs", ""])  # vendor typed, device type left at its default
    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt: (asked.append(prompt), next(answers))[1])
    rc = main(["new-plugin", "acme", "-o", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    assert asked == [
        "Vendor (who publishes the plugin) [The acme authors]: ",
        "torch device type [cpu]: ",
    ]
    meta = tomllib.loads((tmp_path / "opcore-plugin-acme" / "pyproject.toml").read_text())
    assert meta["project"]["authors"] == [{"name": "Acme Labs"}]
    assert "Created " in capsys.readouterr().out
