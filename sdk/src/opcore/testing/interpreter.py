"""Running a test file's Triton kernels on the CPU through Triton's interpreter.

Triton reads ``TRITON_INTERPRET`` when it is first imported, and the rest of a test session
shares that process, so a test module that needs the interpreter re-runs itself in a child
``pytest`` with the variable set:

    if not UNDER_TRITON_INTERPRETER:
        def test_under_interpreter():
            rerun_under_triton_interpreter(__file__)
    else:
        ...  # the real tests, run in the child
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

UNDER_TRITON_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"


def rerun_under_triton_interpreter(
    test_file: str, *, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``pytest test_file`` in a child with ``TRITON_INTERPRET=1`` (plus ``env``) and
    fail with the child's output unless it ran tests and all of them passed. Skips when
    Triton does not import here."""
    import pytest

    pytest.importorskip("triton")
    child_env = {**os.environ, "TRITON_INTERPRET": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--import-mode=importlib", "-x", test_file],
        env=child_env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout, proc.stdout[-3000:]
    return proc


def run_script_under_triton_interpreter(
    script: str, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``python script *args`` in a child with ``TRITON_INTERPRET=1`` and no
    ``OPCORE_*`` variable of this process (a bench script's ``--quick`` CPU mode); fail
    with the child's output unless it exits 0. Skips when Triton does not import here."""
    import pytest

    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc
