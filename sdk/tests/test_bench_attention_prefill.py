"""bench/attention_prefill.py --quick on the CPU (Triton's interpreter, in a child process:
the variable must be set before Triton is first imported): every provider is timed on
every row, the paged prefill kernel and the legacy kernel agree with SDPA, and the mixed
batch and its two parts are timed. Timings themselves are not checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opcore.testing.interpreter import run_script_under_triton_interpreter

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "attention_prefill.py"


def test_prefill_bench_quick_runs_on_the_cpu(tmp_path):
    run_script_under_triton_interpreter(str(SCRIPT), "--quick", "--out", str(tmp_path))
    result = json.loads((tmp_path / "attention_prefill.json").read_text())
    rows = result["rows"]
    assert len(rows) == 3 and not result["not_measured"]
    # A whole prompt past one 128-row tile, a 128-token page, a chunk over a prefix.
    assert {(r["q_len"], r["ctx"], r["block_size"]) for r in rows} == {
        (129, 129, 16),
        (64, 64, 128),
        (64, 200, 16),
    }
    for r in rows:
        assert set(r["providers"]) == {
            "paged_prefill", "paged_pointers", "legacy", "sdpa_flash", "sdpa_flash_mha",
            "sdpa_gather", "sdpa_cudnn", "sdpa_default",
        }  # fmt: skip
        # No descriptors on the CPU (the platform does not copy their tiles).
        assert r["kv_descriptors"] is False
        # No cuDNN on the CPU: recorded as refused, never timed as something else.
        assert r["providers"]["sdpa_cudnn"] is None
        assert r["ratio_vs_best_sdpa"] <= r["ratio_vs_flash"]
        assert r["best_sdpa"] in ("sdpa_flash", "sdpa_flash_mha", "sdpa_default")
        for p in (p for p in r["providers"].values() if p is not None):
            assert p["ms"] > 0 and p["tflops_q25"] <= p["tflops"] <= p["tflops_q75"]
        tol = 3e-2 if r["dtype"] == "bfloat16" else 3e-3
        assert r["paged_prefill_max_abs_err"] < tol, r
        assert r["legacy_max_abs_err"] < tol, r
        assert r["paged_pointers_max_abs_err"] < tol, r
        assert r["sdpa_default_max_abs_err"] == 0.0, r  # the reference is the same call
    assert result["mixed"]["decode_rows"] == 3 and result["mixed"]["mixed"]["ms"] > 0
    assert result["complete"] is True
    md = (tmp_path / "attention_prefill.md").read_text()
    assert "| 1x64 / 200 | 4/2 | 64 | float16 | 16 |" in md
    assert "cuDNN form: not timed" in md


def test_prefill_sweep_quick_times_todays_choice(tmp_path):
    run_script_under_triton_interpreter(str(SCRIPT), "--quick", "--sweep", "--out", str(tmp_path))
    recs = json.loads((tmp_path / "attention_prefill_sweep.json").read_text())["sweep"]
    assert len(recs) == 3, recs  # today's choice plus the first two settings of head 64
    assert sum(r["chosen"] for r in recs) == 1
    for r in recs:
        assert r["tflops"] > 0 and r["err"] < 3e-2, r


def test_a_stopped_prefill_bench_keeps_the_rows_it_measured(tmp_path):
    # A device call's limit stopped the bench after 61 rows on 2026-12-06 and it left no
    # results file: the rows are now written as they are measured.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        for line in proc.stdout:
            if "; ratio " in line:  # the first row, printed after it was written
                break
        proc.kill()
    finally:
        proc.wait(timeout=60)
    result = json.loads((tmp_path / "attention_prefill.json").read_text())
    assert len(result["rows"]) == 1 and result["complete"] is False
    assert len(result["not_measured"]) == 2  # the rows not started yet
    assert "The run did not finish" in (tmp_path / "attention_prefill.md").read_text()


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("attention_prefill_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rounds_time_every_provider_in_a_rotated_order():
    # Timed one after the other, the first provider of a row got the clock the others did
    # not (identical launches differed by 15 % on an H100): with rounds, each provider is
    # timed once a round, each round starting one later, and the medians are the rounds'.
    bench = _bench_module()
    order, clock = [], iter(range(100))
    fns = {name: name for name in ("a", "b", "c")}

    def time_fn(fn):
        order.append(fn)
        t = float(next(clock))
        return t, t - 0.5, t + 0.5

    got = bench.time_rounds(fns, time_fn, rounds=3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert got["a"][3] == [0.0, 5.0, 7.0] and got["a"][0] == 5.0
    assert got["a"][1] == 2.5 and got["a"][2] == 6.0  # quartiles of the round medians
    one = bench.time_rounds(fns, time_fn, rounds=1)  # one round: time_fn's own quartiles
    assert one["a"][:3] == (9.0, 8.5, 9.5)


def test_interleaving_calls_every_provider_once_a_pass_in_shuffled_orders():
    # Timed in blocks, a kernel right after cuDNN's ran 2-5 % slower than the same launch
    # after a lighter one: interleaved, each pass calls every provider once, and the orders
    # differ between passes, so no provider always follows the same one.
    bench = _bench_module()
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c", "d")}
    got = bench.time_interleaved(fns, "cpu", reps=12)
    warm, passes = calls[:4], [calls[4 + 4 * i : 8 + 4 * i] for i in range(12)]
    assert warm == ["a", "b", "c", "d"] and len(calls) == 4 + 48
    assert all(sorted(p) == ["a", "b", "c", "d"] for p in passes)
    assert len({tuple(p) for p in passes}) > 3  # shuffled, not one order repeated
    predecessors = {tuple(p[i - 1 : i + 1]) for p in passes for i in range(1, 4)}
    assert len({x for x, y in predecessors if y == "a"}) > 1  # "a" follows several
    for med, q25, q75, samples in got.values():
        assert len(samples) == 12 and q25 <= med <= q75
    calls.clear()
    bench.time_providers(fns, None, rounds=5, interleave=2, device="cpu")
    assert len(calls) == 4 + 8  # interleave overrides rounds


def test_prefill_bench_mixed_only_times_only_the_mixed_batch(tmp_path):
    run_script_under_triton_interpreter(
        str(SCRIPT), "--quick", "--mixed-only", "--rounds", "2", "--out", str(tmp_path)
    )
    result = json.loads((tmp_path / "attention_prefill.json").read_text())
    assert result["rows"] == [] and result["complete"] is True and result["rounds"] == 2
    for part in ("mixed", "decode_part", "prefill_part"):
        assert len(result["mixed"][part]["ms_rounds"]) == 2
    run_script_under_triton_interpreter(
        str(SCRIPT), "--quick", "--mixed-only", "--interleave", "3", "--out", str(tmp_path)
    )
    result = json.loads((tmp_path / "attention_prefill.json").read_text())
    assert result["interleave"] == 3
    assert all(len(result["mixed"][p]["ms_rounds"]) == 3 for p in ("mixed", "decode_part"))


def test_prefill_rows_sweep_quick_times_the_late_rows(tmp_path):
    run_script_under_triton_interpreter(
        str(SCRIPT), "--quick", "--sweep", "--sweep-set", "rows", "--out", str(tmp_path)
    )
    recs = json.loads((tmp_path / "attention_prefill_sweep.json").read_text())["sweep"]
    assert {(r["heads"], r["kv_heads"]) for r in recs} == {(6, 2)}  # a group of 3
    assert any("late_rows=True" in r["launch"] for r in recs)
    for r in recs:
        assert r["err"] < 3e-2, r


def test_prefill_short_sweep_quick_times_pointer_launches_around_todays(tmp_path):
    run_script_under_triton_interpreter(
        str(SCRIPT), "--quick", "--sweep", "--sweep-set", "short", "--out", str(tmp_path)
    )
    recs = json.loads((tmp_path / "attention_prefill_sweep.json").read_text())["sweep"]
    assert len(recs) == 2 and sum(r["chosen"] for r in recs) == 1
    for r in recs:
        assert "kv_tma=False" in r["launch"] and "late_rows=True" in r["launch"], r
        assert r["err"] < 3e-2, r
