"""What the cuda plugin's CPU tests of the Triton providers share: ``opcore conformance``
run in a child process under Triton's interpreter on the cpu platform.

A child process because the interpreter must be on before `opcore.kernels.triton` is
first imported, and the rest of the suite shares this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

CODE = (
    "import sys, opcore.kernels.triton as kt\n"
    "assert kt.INTERPRETED, 'kernels were not built under the interpreter'\n"
    "from opcore.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.fixture
def interpreted_conformance(tmp_path: Path) -> Callable[..., list[dict]]:
    """``run(*args)``: ``opcore conformance *args --no-progress --report-dir tmp_path`` with
    ``TRITON_INTERPRET=1`` and ``OPCORE_PLATFORM=cpu``; asserts it exits 0 (the output's
    tail in the message otherwise) and returns the records of ``conformance.jsonl``."""

    def run(*args: str) -> list[dict]:
        env = {**os.environ, "TRITON_INTERPRET": "1", "OPCORE_PLATFORM": "cpu"}
        argv = ["conformance", *args, "--no-progress", "--report-dir", str(tmp_path)]
        proc = subprocess.run(
            [sys.executable, "-c", CODE, *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
        lines = (tmp_path / "conformance.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    return run
