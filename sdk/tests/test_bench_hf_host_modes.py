"""bench/hf_host_modes.py's plumbing on the CPU (``--tiny``): the process is pinned to each
CPU in turn and then released, every setting has its passes, and the report says that
nothing compiled while measuring. Timings are not checked (performance is measured by
benchmarks, not tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers is not installed")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "hf_host_modes.py"


def test_tiny_run_times_each_cpu_setting(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--config", "hf", "--cpus",
         ",".join(map(str, cpus)), "--out", str(tmp_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "host_modes-tiny-qwen3-hf-b2.json").read_text())
    assert [r["cpu"] for r in report["results"]] == ["all", *cpus, "all"]
    assert all(len(r["host_ms"]) == len(r["step_ms"]) == 1 for r in report["results"])
    assert report["graphs_compiled_while_measuring"] == 0
