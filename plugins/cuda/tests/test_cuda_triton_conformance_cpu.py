"""The conformance suite's op samples for the ``triton`` provider, run on the CPU under
Triton's interpreter (the kernels the cuda and rocm platforms use on GPUs).

A child process: the interpreter must be on before `opcore.kernels.triton` is first
imported, and the rest of the suite shares this process. Numerics (every sample of every
op against the float64 reference) and the in-place overload, fp32 and bf16 (fp16 is
covered by sdk/tests/test_triton_kernels.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
pytest.importorskip("opcore_conformance")


def test_conformance_samples_pass_for_triton_under_the_interpreter(interpreted_conformance):
    records = interpreted_conformance(
        "--providers",
        "triton",
        "--checks",
        "numerics,maybe_inplace",
        "--dtypes",
        "float32,bfloat16",
    )
    statuses: dict[tuple[str, str], int] = {}
    ops = set()
    for rec in records:
        if rec.get("provider") == "triton":
            if rec["status"] == "unsupported":
                # the one sample kind the provider declines: grouped_topk with a
                # score-correction bias (docs/ops.md#mixture-of-experts)
                assert rec["op"] == "grouped_topk" and rec["sample"].endswith("_bias"), rec
                continue
            statuses[rec["status"]] = statuses.get(rec["status"], 0) + 1
            ops.add(rec.get("op"))
    assert set(statuses) == {"pass"}, statuses
    assert statuses["pass"] > 300
    assert ops >= {
        "rms_norm",
        "fused_add_rms_norm",
        "silu_and_mul",
        "gelu_and_mul",
        "rotary_embedding",
        "split_qkv_rmsnorm_rope",
        "topk_softmax",
        "grouped_topk",
        "fused_experts",
    }
