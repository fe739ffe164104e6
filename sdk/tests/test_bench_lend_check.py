"""bench/lend_check.py on the recorded H200 launch sweep and the shipped H200 table (real
data, in the repository): every row's lent configuration is the one `lend_row` gives, its
time is the sweep's, the summary counts what the rows say, and lending token-filled rows
(the rejected rule) reaches more rows than lending measured buckets only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "lend_check.py"
SWEEP = ROOT / "bench" / "results" / "2026-12-02-h200-session2" / "sweep.jsonl"
TABLE = next((ROOT / "plugins" / "cuda" / "src" / "opcore_plugin_cuda" / "tuning").glob("*.json"))


def _run(tmp_path, *extra) -> dict:
    out = tmp_path / f"r{len(extra)}.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--sweep", str(SWEEP), "--table", str(TABLE),
         "--json", str(out), "--out", str(tmp_path / "r.md"), *extra],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "# Lending check" in proc.stdout
    return json.loads(out.read_text())


def test_lend_check_reads_the_recorded_sweep(tmp_path):
    got = _run(tmp_path)
    sweep = [json.loads(x) for x in SWEEP.read_text().splitlines()[1:] if x.strip()]
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

    filled = _run(tmp_path, "--filled")
    assert filled["summary"]["borrower"]["with_a_config"] > s["with_a_config"]
