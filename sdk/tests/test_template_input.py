"""What a user types into ``opcore new-plugin`` is data, never template, and is taken whole.

cookiecutter renders every value it is given as a Jinja template, in an environment that can
reach ``os`` through Jinja's globals. These tests hand ``opcore new-plugin`` template syntax,
code-running payloads, quotes, backslashes and trailing newlines in every field it takes
(name, ``--vendor``, ``--device-type``, the vendor typed at the prompt, ``-o DIR``) and check
the project holds exactly the text typed, quoted for where it lands, or that the field is
refused in one line. Rendering only (the real cookiecutter, in this process); installing what
is rendered is test_template_install.py.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

from opcore import templates
from opcore.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Jinja globals that reach the os module from a template, in the environment cookiecutter
# renders with. Each payload makes the directory MARKER if it is ever evaluated.
PAYLOADS = [
    "{{ cycler.__init__.__globals__.os.mkdir('MARKER') }}",
    "{% set _ = lipsum.__globals__['os'].mkdir('MARKER') %}done",
    "{{ joiner.__init__.__globals__.__builtins__['__import__']('os').mkdir('MARKER') }}",
]
QUOTED_VENDORS = [
    'Acme "Labs"',
    "O'Brien & Söhne <dev@example.com>",
    "C:\\vendors\\acme\\",
    'x"""y',
    "a\\",
    '\\"',
    'trailing quote"',
    "Nimbus Inc.",
    "emoji 😀 corp {",
]


def render_cli(tmp_path: Path, *args: str) -> Path:
    rc = main(["new-plugin", "acme", "-o", str(tmp_path), "--no-input", *args])
    assert rc == 0
    return tmp_path / "opcore-plugin-acme"


def import_rendered(project: Path, tag: str):
    """Execute the rendered package's ``__init__.py`` as a module (not kept in sys.modules)."""
    path = project / "src" / "opcore_plugin_acme" / "__init__.py"
    spec = importlib.util.spec_from_file_location(f"rendered_opcore_plugin_acme_{tag}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vendor_lines(project: Path) -> tuple[str, str, str]:
    """The vendor as pyproject.toml means it, and the README and docstring lines naming it."""
    meta = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    (author,) = meta["project"]["authors"]
    readme = (project / "README.md").read_text(encoding="utf-8").splitlines()[2]
    doc = import_rendered(project, str(abs(hash(str(project))))).__doc__.splitlines()[0]
    return author["name"], readme, doc


def expected_line(vendor: str) -> str:
    """' by VENDOR.' with no second period when the vendor already ends in one."""
    return f" by {vendor}" + ("" if vendor.endswith(".") else ".")


def test_vendor_template_syntax_renders_literally(tmp_path):
    project = render_cli(tmp_path, "--vendor", "{{ 7*7 }}")
    author, readme, doc = vendor_lines(project)
    assert author == "{{ 7*7 }}"
    assert readme.endswith(" by {{ 7*7 }}.") and doc.endswith(" by {{ 7*7 }}.")
    assert "49" not in (project / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("payload", PAYLOADS)
def test_vendor_payload_never_runs_and_renders_literally(tmp_path, payload):
    from cookiecutter.environment import StrictEnvironment

    # Control: the payload is live in the environment cookiecutter renders values with.
    control = tmp_path / "control"
    StrictEnvironment(context={}).from_string(payload.replace("MARKER", str(control))).render()
    assert control.is_dir(), "the payload no longer runs in a plain Jinja environment"

    marker = tmp_path / "marker"
    vendor = payload.replace("MARKER", str(marker))
    project = render_cli(tmp_path / "out", "--vendor", vendor)
    assert not marker.exists(), "the vendor text was evaluated as a template"
    author, readme, doc = vendor_lines(project)
    assert author == vendor
    assert readme.endswith(expected_line(vendor)) and doc.endswith(expected_line(vendor))


def test_vendor_typed_at_the_prompt_is_data(tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    marker = tmp_path / "marker"
    vendor = PAYLOADS[0].replace("MARKER", str(marker))
    answers = iter([vendor, ""])
    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    assert main(["new-plugin", "acme", "-o", str(tmp_path / "out")]) == 0
    assert not marker.exists()
    assert vendor_lines(tmp_path / "out" / "opcore-plugin-acme")[0] == vendor


@pytest.mark.parametrize("payload", ["{{ 7*7 }}", PAYLOADS[0]])
def test_output_dir_is_data(tmp_path, payload):
    """cookiecutter renders the paths it creates: the -o path must not be one of them."""
    marker = tmp_path / "marker"
    out = tmp_path / payload.replace("MARKER", str(marker)).replace("/", "_")
    project = render_cli(out)
    assert not marker.exists()
    assert project.is_dir() and (project / "src" / "opcore_plugin_acme" / "providers.py").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name], "a path was evaluated"


@pytest.mark.parametrize("vendor", QUOTED_VENDORS)
def test_vendor_with_quotes_and_backslashes_is_valid_toml_and_python(tmp_path, vendor):
    project = render_cli(tmp_path, "--vendor", vendor)
    author, readme, doc = vendor_lines(project)  # parses the TOML, imports the package
    assert author == vendor
    assert readme.endswith(expected_line(vendor)) and doc.endswith(expected_line(vendor))
    for path in project.rglob("*.py"):
        ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_vendor_ending_in_a_period_gets_no_second_one(tmp_path):
    project = render_cli(tmp_path, "--vendor", "Nimbus Inc.")
    for rel in ("README.md", "src/opcore_plugin_acme/__init__.py"):
        text = (project / rel).read_text(encoding="utf-8")
        assert "by Nimbus Inc.\n" in text and "Inc.." not in text, rel


@pytest.mark.parametrize(
    "args, field",
    [
        (["acme\n", "--vendor", "Acme"], "plugin name 'acme\\n'"),
        (["acme\n"], "plugin name 'acme\\n'"),
        (["acme", "--device-type", "cpu\n"], "device type 'cpu\\n'"),
        (["acme", "--vendor", "Acme\n"], "vendor 'Acme\\n'"),
        (["acme", "--vendor", "Acme\r\nLabs"], "vendor 'Acme\\r\\nLabs'"),
    ],
)
def test_trailing_newline_is_refused_in_one_line_naming_the_field(tmp_path, capsys, args, field):
    rc = main(["new-plugin", *args, "-o", str(tmp_path), "--no-input"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(f"opcore new-plugin: error: {field} "), err
    assert list(tmp_path.iterdir()) == []


def test_hook_matches_names_whole_without_the_cli(tmp_path, capfd):
    """Plain cookiecutter on the template: the pre-generation hook refuses 'acme\\n' too."""
    from cookiecutter.exceptions import FailedHookException
    from cookiecutter.main import cookiecutter

    config = tmp_path / "cc.yaml"
    config.write_text(json.dumps({"replay_dir": str(tmp_path / "replay")}), encoding="utf-8")
    with pytest.raises(FailedHookException):
        cookiecutter(
            str(templates.plugin_template_dir()),
            no_input=True,
            extra_context={"plugin_name": "acme\n", "vendor": "Acme"},
            output_dir=str(tmp_path / "out"),
            config_file=str(config),
        )
    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert len(errors) == 1 and errors[0].startswith("ERROR: plugin name 'acme\\n' is not"), errors


@pytest.mark.parametrize(
    "text",
    [
        "{{ 7*7 }}",
        "{% if true %}x{% endif %}",
        "{# c #}",
        "{% raw %}{{ 1 }}{% endraw %}",
        "{{ '{' }}",
        "{{{{",
        "}}}}",
        "{-",
        "{%- -%}",
        "\\{{ x }}",
        "a}b{c",
        "",
        "plain",
    ],
)
def test_literal_template_renders_back_to_the_text(text):
    from cookiecutter.environment import StrictEnvironment

    assert (
        StrictEnvironment(context={}).from_string(templates.literal_template(text)).render() == text
    )


def test_template_keeps_the_default_jinja_delimiters():
    """`literal_template` relies on every Jinja construct opening with '{'."""
    context = json.loads((templates.plugin_template_dir() / "cookiecutter.json").read_text())
    assert "_jinja2_env_vars" not in context
