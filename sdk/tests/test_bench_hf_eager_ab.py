"""bench/hf_eager_ab.py's plumbing on the CPU (``--tiny``): both models, both caches, both
batch sizes; every round has an hf and an opcore pass, the model was patched exactly in the
opcore passes, and the ratios are the per-round ones. Timings are not checked (performance
is measured by benchmarks, not tests)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers is not installed")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "hf_eager_ab.py"


def test_tiny_interleaved_run_writes_paired_rounds(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "hf_eager_ab.json").read_text())["rows"]
    keys = {(r["model"], r["cache"], r["batch"]) for r in rows}
    assert keys == {
        (m, c, b)
        for m in ("tiny-llama", "tiny-qwen3")
        for c in ("dynamic", "static")
        for b in (1, 2)
    }
    for r in rows:
        assert len(r["hf_ms"]) == len(r["opcore_ms"]) == r["rounds"] == 2
        assert r["forms_as_labelled"], r
        ratios = [o / h for o, h in zip(r["opcore_ms"], r["hf_ms"], strict=True)]
        assert r["ratio_median"] == pytest.approx(statistics.median(ratios))
        assert r["ratio_min"] <= r["ratio_median"] <= r["ratio_max"]
    md = (tmp_path / "hf_eager_ab.md").read_text()
    assert "| tiny-qwen3 | static | 2 | 2 |" in md
