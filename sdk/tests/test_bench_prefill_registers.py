"""bench/prefill_registers.py on the CPU: the paged prefill kernel compiled for sm_90 with a
real launch's compile-time arguments (`_triton_prefill.kernel_constants`), the registers and
spills read from Triton's own ptxas. No GPU is needed; the figures are not checked beyond
being reported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "prefill_registers.py"
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build ships no ptxas")
def test_prefill_registers_reports_each_configuration(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "regs.md"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| d128")]
    assert len(rows) == 2
    shipped = rows[0].split("|")
    assert "late rows" in shipped[2] and "descriptors" in shipped[2]
    registers = int(shipped[3])
    assert 0 < registers <= 255
