"""bench/moe.py --quick on the CPU (Triton's interpreter, in a child process: the variable
must be set before Triton is first imported): the triton provider is chosen and timed on
prefill and decode rows, agrees with the native op, and the report holds every row.
Timings themselves are not checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opcore.testing.interpreter import run_script_under_triton_interpreter

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "moe.py"


def test_moe_bench_quick_runs_on_the_cpu(tmp_path):
    run_script_under_triton_interpreter(str(SCRIPT), "--quick", "--out", str(tmp_path))
    result = json.loads((tmp_path / "moe.json").read_text())
    rows = result["rows"]
    assert [(r["phase"], r["tokens"]) for r in rows] == [
        ("prefill", 33),
        ("decode", 1),
        ("decode", 4),
    ]
    assert not result["not_measured"]
    for r in rows:
        assert set(r["providers"]) == {"triton", "native", "flag_gems", "liger"}
        t, n = r["providers"]["triton"], r["providers"]["native"]
        assert t["provider"] == "triton" and t["us"] > 0 and n["us"] > 0
        assert t["us_q25"] <= t["us"] <= t["us_q75"]
        assert t["max_abs_err"] <= 4 * 2**-8 * max(1.0, t["ref_max_abs"]), t  # bf16, 4 ulps
        assert 1 <= r["experts_touched"] <= r["experts"]
        if r["phase"] == "prefill":
            assert t["tflops_q25"] <= t["tflops"] <= t["tflops_q75"]
            assert r["dense_gemm"]["tflops"] > 0 and t["pct_of_dense"] > 0
        else:
            assert t["weight_gbs"] > 0
    md = (tmp_path / "moe.md").read_text()
    assert "| tiny | 33 |" in md and "| tiny | 4 |" in md


def test_moe_sweep_quick_times_each_setting_and_restores_moe_params(tmp_path):
    from opcore.kernels.triton import moe  # moe_params is plain Python; no kernel runs here

    run_script_under_triton_interpreter(str(SCRIPT), "--quick", "--sweep", "--out", str(tmp_path))
    recs = json.loads((tmp_path / "moe_sweep.json").read_text())["records"]
    # two gate/up settings, then the best of them with the second down setting
    assert [[r["gate_up"], r["down"]] for r in recs][:2] == [
        [[64, 128, 4, 3], [128, 128, 4, 3]],
        [[64, 128, 4, 4], [128, 128, 4, 3]],
    ]
    assert len(recs) == 3 and recs[2]["down"] == [64, 128, 4, 4]
    for r in recs:
        assert r["us"] > 0 and r["BLOCK_M"] == 16, r
        assert r["max_abs_err_vs_today"] <= 4 * 2**-8, r  # the same sums in another tiling
        assert r["today"] == moe.moe_params(33 * 2, 8, False)  # what a call picks, recorded


def test_moe_bench_phase_keeps_only_that_phases_rows():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_moe", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # module level defines the grid only; nothing runs
    every = bench.rows(False)
    prefill = bench.rows(False, "prefill")
    assert prefill and {r["phase"] for r in prefill} == {"prefill"}
    assert bench.rows(False, "decode") + prefill == every  # decode first, then prefill
    assert bench.rows(True, "decode") == [r for r in bench.rows(True) if r["phase"] == "decode"]
