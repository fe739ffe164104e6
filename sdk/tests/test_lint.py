"""The repository is ruff-formatted and ruff-clean, with the configuration in the root
``pyproject.toml`` (line length 100, E501 on, the selected rule sets).

Both checks run the ``ruff`` next to the running interpreter (the one ``requirements.txt``
installs into the environment) over the whole checkout, from its root, so they see what
``ruff`` run by hand sees: the same configuration, ``.gitignore`` respected. A failure
names every offending file and the command that fixes it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")

# "path:line:col: CODE message" (ruff's concise output)
_CONCISE = re.compile(r"^(?P<path>[^:\n]+):\d+:\d+: (?P<code>[A-Z]+[0-9]+) ")
_UNFORMATTED = re.compile(r"^(?P<path>[^:\n]+):\d+:\d+: unformatted: ")


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    if not RUFF.exists():
        pytest.fail(
            f"ruff is not installed next to {sys.executable}: pip install -r requirements.txt"
        )
    return subprocess.run(
        [str(RUFF), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _unexpected(proc: subprocess.CompletedProcess[str]) -> str:
    return f"ruff exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def reformat_needed(output: str) -> list[str]:
    """The files ``ruff format --check --output-format concise`` reports
    (``<path>:<line>:<col>: unformatted: ...``; older ruff: ``Would reformat: <path>``)."""
    files = set()
    for line in output.splitlines():
        m = _UNFORMATTED.match(line)
        if m:
            files.add(m["path"])
        elif line.startswith("Would reformat: "):
            files.add(line.removeprefix("Would reformat: ").strip())
    return sorted(files)


def lint_problems(output: str) -> dict[str, list[str]]:
    """``{file: [rule codes]}`` from ``ruff check --output-format concise`` output."""
    found: dict[str, list[str]] = {}
    for line in output.splitlines():
        m = _CONCISE.match(line)
        if m:
            found.setdefault(m["path"], []).append(m["code"])
    return dict(sorted(found.items()))


def test_the_parsers_read_ruffs_output():
    fmt = (
        "sdk/b.py:199:17: unformatted: File would be reformatted\n"
        "docs/a.md:139:29: unformatted: File would be reformatted\n"
        "2 files would be reformatted, 383 files already formatted\n"
    )
    assert reformat_needed(fmt) == ["docs/a.md", "sdk/b.py"]
    assert reformat_needed("Would reformat: bench/a.py\n1 file would be reformatted\n") == [
        "bench/a.py"
    ]
    check = (
        "sdk/src/opcore/x.py:3:101: E501 Line too long (104 > 100)\n"
        "sdk/src/opcore/x.py:9:1: I001 [*] Import block is un-sorted or un-formatted\n"
        "bench/y.py:1:8: F401 [*] `os` imported but unused\n"
        "Found 3 errors.\n"
    )
    assert lint_problems(check) == {
        "bench/y.py": ["F401"],
        "sdk/src/opcore/x.py": ["E501", "I001"],
    }


def test_the_tree_is_ruff_formatted():
    proc = _ruff("format", "--check", "--output-format", "concise", ".")
    files = reformat_needed(proc.stdout)
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not files):
        pytest.fail(_unexpected(proc))
    if files:
        pytest.fail(
            f"{len(files)} file(s) are not ruff-formatted. From the repository root run:\n\n"
            f"    ruff format {' '.join(files)}\n",
            pytrace=False,
        )


def test_the_tree_is_ruff_clean():
    proc = _ruff("check", "--output-format", "concise", ".")
    problems = lint_problems(proc.stdout)
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not problems):
        pytest.fail(_unexpected(proc))
    if not problems:
        return
    files = list(problems)
    listing = "\n".join(
        f"    {path}: {', '.join(sorted(set(codes)))}" for path, codes in problems.items()
    )
    pytest.fail(
        f"ruff check finds problems in {len(files)} file(s):\n{listing}\n\n"
        "From the repository root run:\n\n"
        f"    ruff check --fix {' '.join(files)}\n"
        f"    ruff format {' '.join(files)}\n\n"
        "then fix by hand what remains (`ruff check <file>` shows each with its line): "
        "E501 is a line over 100 characters; wrap it, do not silence it.\n\n" + proc.stdout[-4000:],
        pytrace=False,
    )
