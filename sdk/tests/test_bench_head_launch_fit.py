"""bench/head_launch_fit.py: the head kernels' adopted launch rule (`_launch`) against the
earlier one, on the H100 sweep it was fitted to (bench/results/2026-12-06-h100-launch/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opcore.testing import scripts

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "head_launch_fit.py"
SWEEP = ROOT / "bench/results/2026-12-06-h100-launch/head-sweep-fit.jsonl"

pytest.importorskip("triton")


def fit():
    return scripts.load_script(SCRIPT)


def test_the_earlier_rule_is_the_one_launch_used_before_the_fit():
    m = fit()
    thp, sqp = m.earlier_token_head_params, m.earlier_split_qkv_params
    # the values the kernel tests asserted before the fitted rule was adopted
    assert thp(32768, 32, 8, 128, 132) == (1, 32, 8, 8)
    assert thp(1, 32, 8, 128, 132) == (8, 4, 1, 2)
    assert thp(256, 32, 8, 128, 132) == (4, 8, 2, 4)
    assert thp(2, 28, 4, 128, 132) == (4, 8, 1, 4)
    assert thp(256, 32, 8, 128, 8) == thp(256, 32, 8, 128, 1024)  # blind to the device
    assert sqp(32768, 32, 8, 128, 132) == (1, 32, 8, 2)
    assert sqp(1, 32, 8, 128, 132) == thp(1, 32, 8, 128, 132)


def test_on_its_sweep_the_adopted_rule_is_nowhere_behind_the_earlier_one(tmp_path):
    out = tmp_path / "report.md"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--sweep", str(SWEEP), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert len(rows) == 12  # two ops x six token counts
    for line in rows:
        earlier, adopted = line.split(": ", 1)[1].split(" -> ")
        assert float(adopted.split()[0]) <= float(earlier.split()[0]), line
    assert "# The adopted rule" in out.read_text()
