"""bench/hf_moe.py --quick on the CPU (a tiny Qwen3-MoE config, fp32, in a child process):
the three configurations are timed in every round, opcore's patches cover every sparse
block and match HF's hidden states and next token, and the report holds the row. Timings
themselves are not checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "hf_moe.py"


def test_hf_moe_bench_quick_runs_on_the_cpu(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "hf_moe.json").read_text())
    assert result["env"]["model"] == "tiny" and result["env"]["layers"] == 2
    (row,) = result["rows"]
    assert row["tokens"] == 16 and len(row["rounds"]) == 2
    assert list(row["rounds"][1]) == ["opcore", "opcore_all", "hf"]  # the order rotates
    for r in row["rounds"]:
        for config in ("hf", "opcore", "opcore_all"):
            assert r[config]["ms_q25"] <= r[config]["ms"] <= r[config]["ms_q75"], r
    check = row["opcore_vs_hf"]
    assert check["patched_blocks"] == 2  # one sparse block per decoder layer
    for c in (check, row["opcore_all_vs_hf"]):
        assert c["next_token_same"] and c["hidden_max_abs_over_max"] < 1e-5, c
        assert c["tokens_off_by_1pct_per_layer"] == [0, 0] and c["tokens"] == 16, c  # fp32
    for s in row["speedup_over_hf"].values():
        assert s["min"] <= s["median"] <= s["max"]
    assert set(row["speedup_over_hf"]) == {"opcore", "opcore_all"}
    assert "liger" not in result  # GPU only
    assert "| 16 |" in (tmp_path / "hf_moe.md").read_text()
