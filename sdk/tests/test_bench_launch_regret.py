"""bench/launch_regret.py on the recorded H200 launch sweep (real data, in the repository):
each row's model choice is the launch spaces' default now, its regret is the sweep's time
for it over the fastest configuration's, and noisy rows are counted apart from the means."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "launch_regret.py"
SWEEP = ROOT / "bench" / "results" / "2026-12-02-h200-session2" / "sweep.jsonl"


def test_launch_regret_reads_the_recorded_sweep(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--sweep", str(SWEEP), "--json", str(out)],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    sweep = [json.loads(x) for x in SWEEP.read_text().splitlines()[1:] if x.strip()]
    assert len(got["rows"]) + len(got["model_not_timed"]) == len(sweep)
    by_key = {(r["op"], r["width"], r["tokens"]): r for r in sweep}
    for r in got["rows"]:
        rec = by_key[(r["op"], r["shape"][0], r["tokens"])]
        ok = [c for c in rec["configs"] if c.get("ok")]
        assert r["best_us"] == min(c["us"] for c in ok)
        mine = next(c for c in ok if c["config"] == r["model"])
        assert r["model_us"] == mine["us"] and r["regret"] >= 1.0
        assert r["regret"] == round(mine["us"] / r["best_us"], 4)
    for name, s in got["summary"].items():
        op, tokens = name.split(" T=")
        mine = [r for r in got["rows"] if r["op"] == op and r["tokens"] == int(tokens)]
        clean = [r["regret"] for r in mine if not r["noisy"]]
        assert s["rows"] == len(mine) and s["noisy"] == len(mine) - len(clean)
        if clean:
            assert s["max"] == max(clean)
            assert math.isclose(
                s["geomean"], math.exp(sum(map(math.log, clean)) / len(clean)), abs_tol=1e-4
            )
    # the recorded sweep's one-launch samples at 64 tokens: some rows are noisy
    assert got["summary"]["silu_and_mul T=64"]["noisy"] > 0
