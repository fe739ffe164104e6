"""bench/head_launch_fit.py: the head kernels' candidate launch rule, on the H100 sweep it
was fitted to (recorded in bench/results/2026-12-06-h100-launch/)."""

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


def test_the_candidate_splits_until_one_program_per_multiprocessor_then_one_per_token():
    thp = fit().token_head_params
    # one program per token from as many tokens as multiprocessors: ~1024 real elements a warp
    assert thp(32768, 32, 8, 128, 132) == (1, 32, 8, 4)
    assert thp(32768, 64, 8, 128, 132) == (1, 64, 8, 8)
    assert thp(32768, 32, 0, 128, 132) == (1, 32, 1, 4)  # key=None
    assert thp(256, 32, 8, 128, 132) == (1, 32, 8, 4)
    # fewer: heads split, ~128 elements of the padded tile a warp
    assert thp(1, 32, 8, 128, 132) == (8, 4, 1, 4)
    assert thp(2, 28, 4, 128, 132) == (4, 8, 1, 8)
    # the threshold is the device's multiprocessor count
    assert thp(256, 32, 8, 128, 1024) == (4, 8, 2, 8)
    for t in (1, 7, 300, 5000):
        for a in (1, 3, 28, 64):
            for b in (0, 1, 5, 8):
                for sms in (8, 132):
                    programs, ba, bb, w = thp(t, a, b, 128, sms)
                    assert programs * ba >= a and programs * bb >= b  # every head covered
                    assert w & (w - 1) == 0 and 1 <= w <= 8


def test_the_candidate_split_kernel_takes_one_warp_when_split():
    m = fit()
    sqp = m.split_qkv_params
    assert sqp(1, 32, 8, 128, 132) == (8, 4, 1, 1)
    assert sqp(256, 32, 8, 128, 132) == m.token_head_params(256, 32, 8, 128, 132)
    assert sqp(32768, 32, 8, 128, 132) == (1, 32, 8, 2)
    assert sqp(32768, 64, 8, 128, 132) == (1, 64, 8, 4)
    assert sqp(529, 32, 8, 128, 132) == (1, 32, 8, 2)


def test_on_its_sweep_the_candidate_is_nowhere_behind_todays_rule(tmp_path):
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
        today, candidate = line.split(": ", 1)[1].split(" -> ")
        assert float(candidate.split()[0]) <= float(today.split()[0]), line
    assert "# The candidate rule" in out.read_text()
