"""bench/norm_decode.py on the CPU: under Triton's interpreter both load orders of the norm
kernel give the triton provider's bits (the script exits 1 otherwise) and each is timed in
every round; ``--sass`` compiles them for sm_90 with no GPU and shows where the weight's
loads sit against the reduction's barrier. Timings are not checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opcore.testing.interpreter import run_script_under_triton_interpreter

pytest.importorskip("triton")
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "norm_decode.py"


def test_quick_load_orders_agree_with_the_provider_and_are_timed(tmp_path):
    out = tmp_path / "rows.json"
    run_script_under_triton_interpreter(
        str(SCRIPT), "--quick", "--rounds", "2", "--tokens", "1,3", "--json", str(out)
    )
    rows = json.loads(out.read_text())
    assert [(r["op"], r["hidden"], r["tokens"]) for r in rows] == [
        (op, h, t) for op in ("rms_norm", "fused_add_rms_norm") for h in (96, 200) for t in (1, 3)
    ]
    for r in rows:
        assert r["timer"] == "host" and r["opcore"] > 0 and r["triton"] > 0
        assert min(r[k] for k in ("after_e8", "first_e8", "after_e16", "first_e16")) > 0


def test_sass_places_the_weight_loads_before_the_barrier_only_when_asked(tmp_path):
    out = tmp_path / "sass.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--sass", "--hidden", "3584", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {(r["op"], r["weight_first"]): r for r in json.loads(out.read_text())}
    assert len(rows) == 4
    for op in ("rms_norm", "fused_add_rms_norm"):
        after, first = rows[(op, False)], rows[(op, True)]
        assert after["last_load"] > after["first_barrier"]  # a second round trip
        assert first["last_load"] < first["first_barrier"]
        # compiled as a real one-token launch compiles it: every load a 16-byte vector
        # (x, the residual, the weight: 2 a tensor at 3584 columns on 16 warps)
        assert after["vector_loads"] == after["loads"] == (6 if op != "rms_norm" else 4)


def test_the_check_allows_another_warp_counts_rounding_but_not_a_load_order_that_changes_bits():
    """At 512 x 1024 on an H100 the 8-elements-a-thread variants differed from the provider
    (16 a thread) in a last bit, and the bitwise check stopped the run: the two orders on
    the same warps must agree bitwise, any variant with the provider only to rounding."""
    import torch

    from opcore.testing import scripts

    nd = scripts.load_script(SCRIPT)
    want = (torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16),)
    other_sum = (torch.tensor([1.0, 2.0, 3.015625], dtype=torch.bfloat16),)  # one bf16 ulp at 3
    assert nd.disagreements({"after_e8": other_sum, "first_e8": other_sum}, want) == []
    assert nd.disagreements({"after_e8": want, "first_e8": other_sum}, want) == [
        "first_e8 is not bitwise after_e8"
    ]
    wrong = (torch.tensor([1.0, 2.0, 3.5], dtype=torch.bfloat16),)
    assert nd.disagreements({"first_e16": wrong}, want) == [
        "first_e16 differs from the triton provider's output"
    ]


def test_flushed_timing_asks_for_timing_events_instead_of_timing_the_host():
    """``--flushed`` (events after a cache flush, the wide grid's timer past 32 tokens) has
    no meaning on the host clock: the CPU run stops and says why rather than time it."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPCORE_PLATFORM": "cpu"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--flushed", "--tokens", "1"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "--flushed needs a device with timing events" in proc.stderr


def test_quick_fp16_rows_name_their_dtype(tmp_path):
    out = tmp_path / "rows.json"
    run_script_under_triton_interpreter(
        str(SCRIPT), "--quick", "--rounds", "1", "--tokens", "1", "--ops", "fused_add_rms_norm",
        "--dtype", "float16", "--json", str(out),
    )  # fmt: skip
    rows = json.loads(out.read_text())
    assert [(r["dtype"], r["hidden"]) for r in rows] == [("float16", 96), ("float16", 200)]
    assert all(r["first_e16"] > 0 for r in rows)
