"""bench/sweep_report.py on the recorded H200 launch sweep and the shipped H200 table (real
data, in the repository).

- ``regret``: each row's model choice is the launch spaces' default now, its regret the
  sweep's time for it over the fastest configuration's; noisy rows are counted apart.
- ``lend``: every row's lent configuration is the one `lend_row` gives, its time is the
  sweep's, the summary counts what the rows say, and lending token-filled rows (the
  rejected rule) reaches more rows than lending measured buckets only.
"""

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
SCRIPT = ROOT / "bench" / "sweep_report.py"
SWEEP = ROOT / "bench" / "results" / "2026-12-02-h200-session2" / "sweep.jsonl"
TABLE = next((ROOT / "plugins" / "cuda" / "src" / "opcore_plugin_cuda" / "tuning").glob("*.json"))


def _run(tmp_path, report, *extra) -> dict:
    out = tmp_path / f"{report}{len(extra)}.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), report, "--sweep", str(SWEEP), "--json", str(out),
         "--out", str(tmp_path / "r.md"), *extra],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("# ")
    return json.loads(out.read_text())


def _sweep() -> list[dict]:
    return [json.loads(x) for x in SWEEP.read_text().splitlines()[1:] if x.strip()]


def test_regret_reads_the_recorded_sweep(tmp_path):
    got = _run(tmp_path, "regret")
    sweep = _sweep()
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


def test_lend_reads_the_recorded_sweep(tmp_path):
    got = _run(tmp_path, "lend", "--table", str(TABLE))
    sweep = _sweep()
    assert len(got["rows"]) == len(sweep)
    by_key = {(r["op"], r["width"], r["tokens"]): r for r in sweep}
    lent = [r for r in got["rows"] if r["kind"] == "borrower" and r["config"] is not None]
    assert lent, "the shipped table lends to some sweep shape"
    for r in lent:
        rec = by_key[(r["op"], r["shape"][0], r["tokens"])]
        times = {json.dumps(c["config"], sort_keys=True): c["us"] for c in rec["configs"]}
        assert r["config_us"] == times.get(json.dumps(r["config"], sort_keys=True))
        assert r["model_us"] == times.get(json.dumps(r["model"], sort_keys=True))
        assert r["lender"] != r["shape"]
    s = got["summary"]["borrower"]
    assert s["with_a_config"] == len(lent)
    assert s["same_as_model"] == sum(1 for r in lent if r["config"] == r["model"])
    ratios = [r["ratio"] for r in lent if r["ratio"] is not None]
    assert s["min_ratio"] == min(ratios) and s["max_ratio"] == max(ratios)
    # the table's own shapes are compared apart, never lent to
    tuned = [r for r in got["rows"] if r["kind"] == "tuned"]
    assert tuned and all(r["lender"] == r["shape"] for r in tuned)

    filled = _run(tmp_path, "lend", "--table", str(TABLE), "--filled")
    assert filled["summary"]["borrower"]["with_a_config"] > s["with_a_config"]
