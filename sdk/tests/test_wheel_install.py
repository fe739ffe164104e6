"""The documented install next to an existing torch build works from built wheels.

A fresh virtual environment (no system packages) gets torch 2.13.0 first, from this
machine's CPU build; then opcore, opcore-conformance and opcore-plugin-cpu are installed
from a wheelhouse the way docs/getting-started.md says (``pip wheel --no-deps -w dist``,
a constraints file written from the installed torch, ``pip install -c ... --find-links
dist``). The torch build must be the one installed before, no NVIDIA wheel may arrive,
numpy must (a dependency), and ``opcore conformance --ops rms_norm`` must pass there.

The sources are copied first, as in test_template_wheel.py, so the checkout gets no build
folders.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = ("sdk", "conformance", "plugins/cpu")
TORCH = "2.13.0"
pytestmark = pytest.mark.slow


def _run(args: list, *, timeout: int, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # pip's own environment (PIP_FIND_LINKS, PIP_CONSTRAINT, the machine's pip.conf) applies,
    # as it would for a user; the CPU wheel of torch is found through it.
    proc = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode == 0, f"{args}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheelhouse")
    droppings = shutil.ignore_patterns(
        "build", "dist", "*.egg-info", "__pycache__", "*.pyc", "tests", ".venv*"
    )
    for name in DISTRIBUTIONS:
        shutil.copytree(ROOT / name, root / "src" / name, ignore=droppings)
    # The documented command, without build isolation so the test needs no download of
    # setuptools (the flags that matter to the user are --no-deps and -w).
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            root / "dist",
            *(f"./{name}" for name in DISTRIBUTIONS),
        ],
        timeout=300,
        cwd=root / "src",
    )
    wheels = sorted(p.name.split("-")[0] for p in (root / "dist").glob("*.whl"))
    assert wheels == ["opcore", "opcore_conformance", "opcore_plugin_cpu"]
    return root / "dist"


def test_install_next_to_an_existing_torch_keeps_it_and_conforms(wheelhouse, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], timeout=120)
    python = venv / "bin" / "python"
    # --no-compile: byte-compiling torch's sources would be most of this test's time.
    _run(
        [python, "-m", "pip", "install", "--quiet", "--no-compile", f"torch=={TORCH}"], timeout=400
    )
    torch_before = _run([python, "-c", "import torch; print(torch.__version__)"], timeout=120)

    # docs/getting-started.md, "Next to your own torch build".
    constraints = tmp_path / "constraints.txt"
    written = _run(
        [python, "-c", "import torch; print('torch==' + torch.__version__)"], timeout=120
    )
    constraints.write_text(written.stdout)
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "-c",
            constraints,
            "--find-links",
            wheelhouse,
            "opcore-plugin-cpu",
            "opcore-conformance",
        ],
        timeout=400,
    )

    freeze = _run([python, "-m", "pip", "freeze"], timeout=120).stdout.lower().splitlines()
    assert f"torch=={torch_before.stdout.strip()}" in freeze
    assert not [line for line in freeze if line.startswith("nvidia")], freeze
    assert any(line.startswith("numpy==") for line in freeze), freeze

    proc = subprocess.run(
        [
            venv / "bin" / "opcore",
            "conformance",
            "--ops",
            "rms_norm",
            "--report-dir",
            tmp_path / "reports",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OPCORE_", "PYTHON"))},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Failed to initialize NumPy" not in proc.stdout + proc.stderr
    assert (
        str(venv)
        in _run([python, "-c", "import opcore; print(opcore.__file__)"], timeout=120).stdout
    )
