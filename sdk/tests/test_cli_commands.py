"""`opcore`'s subcommands come from the ``opcore.cli_commands`` entry-point group
(`opcore.cli.commands`): what is installed is listed, a distribution adds its own, a broken
one is one line naming its distribution (fatal under ``OPCORE_STRICT_PLUGINS=1``), and
commands that need no torch do not load it. Each case runs the real CLI in a fresh
interpreter over real installed distributions (`opcore.testing.make_distribution`)."""

from __future__ import annotations

import ast
import pathlib

import pytest

from opcore.testing import make_distribution, run_python

GROUP = "opcore.cli_commands"
SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "opcore"

# Runs the CLI and reports, after it, whether torch was imported.
CLI = """
import sys
from opcore.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("TORCH_LOADED=" + str("torch" in sys.modules), file=sys.stderr)
sys.exit(code)
"""

HELLO = '''
"""A command another distribution adds."""


def add_parser(subparsers):
    p = subparsers.add_parser("hello", help="say hello from another distribution")
    p.add_argument("--name", default="world")
    p.set_defaults(run=run)
    return p


def run(args):
    print(f"hello {args.name}")
    return 0
'''


def cli(*args: str, site=None, env=None):
    proc = run_python(CLI, site=site, env=env, args=list(args), timeout=120)
    lines = proc.stderr.splitlines()
    assert lines and lines[-1].startswith("TORCH_LOADED="), proc.stderr
    return proc, lines[:-1], lines[-1] == "TORCH_LOADED=True"


def command_dist(site, name: str, module: str, source: str, command: str) -> None:
    make_distribution(
        site, name, entry_points={GROUP: {command: module}}, files={f"{module}.py": source}
    )


def test_help_lists_the_installed_commands_and_loads_no_torch():
    proc, errors, torch_loaded = cli("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("info", "bench", "new-plugin", "conformance"):
        assert f"    {command}" in proc.stdout, proc.stdout
    assert errors == []
    assert not torch_loaded


@pytest.mark.parametrize("command", ["new-plugin", "bench", "info", "conformance"])
def test_a_command_s_help_loads_no_torch(command):
    proc, errors, torch_loaded = cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert f"usage: opcore {command}" in proc.stdout
    assert not torch_loaded


def test_new_plugin_rejecting_a_name_loads_no_torch():
    proc, errors, torch_loaded = cli("new-plugin", "Bad-Name", "--no-input")
    assert proc.returncode == 2
    assert len(errors) == 1 and errors[0].startswith("opcore new-plugin: error:"), errors
    assert not torch_loaded


def test_another_distribution_adds_a_command(tmp_path):
    command_dist(tmp_path, "opcore-hello", "hello_cmd", HELLO, "hello")
    proc, errors, _ = cli("--help", site=tmp_path)
    assert "say hello from another distribution" in proc.stdout and errors == []
    proc, errors, torch_loaded = cli("hello", "--name", "opcore", site=tmp_path)
    assert (proc.returncode, proc.stdout, errors) == (0, "hello opcore\n", [])
    assert not torch_loaded


BROKEN_IMPORT = "raise ImportError('the vendor runtime is not installed')\n"
BROKEN_EXIT = "def add_parser(subparsers):\n    raise SystemExit(3)\n"
WRONG_NAME = HELLO.replace('add_parser("hello"', 'add_parser("hullo"')


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (BROKEN_IMPORT, "ImportError: the vendor runtime is not installed"),
        (BROKEN_EXIT, "SystemExit: 3"),
        (WRONG_NAME, "added no subcommand named 'broken'"),
    ],
    ids=["import-fails", "add-parser-exits", "wrong-name"],
)
def test_a_broken_command_is_one_line_and_the_others_run(tmp_path, source, why):
    command_dist(tmp_path, "opcore-broken-cmd", "broken_cmd", source, "broken")
    proc, errors, _ = cli("--help", site=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(errors) == 1, errors
    assert errors[0].startswith("opcore: warning: command 'broken'")
    assert "opcore-broken-cmd 0.1.0" in errors[0] and why in errors[0]
    assert "    info" in proc.stdout and "    new-plugin" in proc.stdout
    proc, errors, _ = cli("new-plugin", "--help", site=tmp_path)
    assert proc.returncode == 0 and "usage: opcore new-plugin" in proc.stdout


def test_a_broken_command_is_fatal_under_strict_plugins(tmp_path):
    command_dist(tmp_path, "opcore-broken-cmd", "broken_cmd", BROKEN_IMPORT, "broken")
    proc, errors, _ = cli("info", site=tmp_path, env={"OPCORE_STRICT_PLUGINS": "1"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(errors) == 1 and errors[0].startswith("opcore: error: command 'broken'"), errors
    assert "opcore-broken-cmd 0.1.0" in errors[0]
    assert errors[0].endswith("[OPCORE_STRICT_PLUGINS=1 makes this fatal]")


def test_a_malformed_strict_switch_is_one_line(tmp_path):
    command_dist(tmp_path, "opcore-broken-cmd", "broken_cmd", BROKEN_IMPORT, "broken")
    proc, errors, _ = cli("--help", site=tmp_path, env={"OPCORE_STRICT_PLUGINS": "maybe"})
    assert proc.returncode == 2
    assert len(errors) == 1 and errors[0].startswith("opcore: error:") and "maybe" in errors[0]


def test_a_core_command_name_is_not_taken_by_another_distribution(tmp_path):
    impostor = HELLO.replace('add_parser("hello"', 'add_parser("info"')
    command_dist(tmp_path, "opcore-impostor", "impostor_cmd", impostor, "info")
    proc, errors, _ = cli("info", "--help", site=tmp_path)
    assert proc.returncode == 0
    assert "Show which platform is active" in proc.stdout  # the core's own `info`
    assert len(errors) == 1 and "belongs to opcore " in errors[0]
    assert "opcore-impostor 0.1.0 declares it too and is refused" in errors[0]


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_core_imports_no_sibling_distribution():
    # opcore/templates holds a plugin's sources to render (cookiecutter), not core code.
    core = [p for p in SRC.rglob("*.py") if "templates" not in p.relative_to(SRC).parts]
    offenders = sorted(
        f"{path.relative_to(SRC)}: {name}"
        for path in core
        for name in _imports(path)
        if name.split(".")[0] == "opcore_conformance" or name.startswith("opcore_plugin_")
    )
    assert offenders == []


def test_bench_and_cli_name_no_device_vendor():
    """The benchmark and the CLI reach the device through the `Platform` only."""
    paths = [
        *(SRC / "bench").rglob("*.py"),
        *(SRC / "cli").rglob("*.py"),
        SRC / "attention" / "bench.py",
    ]
    offenders = [
        f"{p.relative_to(SRC)}: {needle}"
        for p in paths
        for needle in ("torch.cuda", "pynvml", '"cuda"')
        if needle in p.read_text(encoding="utf-8")
    ]
    assert offenders == []
