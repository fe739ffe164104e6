"""bench/fp8_kernels.py's check on the CPU: its comparison with the float64 reference
(NaN against NaN of either sign is right, NaN against a number is off; a residual sum
holding NaN where the reference has NaN is right), then ``check`` itself on two ops under
Triton's interpreter (in a child: the variable must be set before Triton is imported).

Before 2026-12-05 the comparison counted a NaN of the other sign bit as 254 codes off and
a residual's NaN as an error, so every op failed its ``nonfinite_rows`` samples on the H200
and here while the conformance suite passed them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from opcore.testing import scripts
from opcore.testing.interpreter import run_script_under_triton_interpreter

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "fp8_kernels.py"
E4M3 = torch.float8_e4m3fn


def _bench():
    return scripts.load_script(SCRIPT)


def _fp8(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.uint8).view(E4M3)


def _compare(got, ref):
    failures: list[str] = []
    counts = _bench()._compare_run("case", got, ref, 1, 0.0, 0.0, 0.0, failures, (0, 0, 0))
    return failures, counts


def test_nan_of_either_sign_matches_the_reference_nan():
    # 0x7F and 0xFF are e4m3fn's NaNs; 0x38 is 1.0
    failures, (off, numel, peak) = _compare([_fp8([0xFF, 0x38])], [_fp8([0x7F, 0x38])])
    assert failures == [] and (off, numel, peak) == (0, 2, 0)


def test_nan_against_a_number_is_off():
    failures, (off, _, peak) = _compare([_fp8([0x7F, 0x38])], [_fp8([0x38, 0x38])])
    assert off == 1 and peak == 1000 and failures == ["case: 1/2 off, peak 1000"]


def test_a_residual_with_nan_where_the_reference_has_nan_matches():
    nan = float("nan")
    got = torch.tensor([1.0, nan, float("inf")], dtype=torch.bfloat16)
    ref = torch.tensor([1.0, nan, float("inf")], dtype=torch.float64)
    assert _compare([got], [ref])[0] == []
    failures, _ = _compare([torch.tensor([1.0, 2.0], dtype=torch.bfloat16)],
                           [torch.tensor([1.0, nan], dtype=torch.float64)])  # fmt: skip
    assert failures == ["case: output 0 off by inf"]


def test_check_passes_the_nonfinite_samples_under_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    ops = "scaled_fp8_quant,fused_add_rms_norm_static_fp8_quant"
    run_script_under_triton_interpreter(
        str(SCRIPT), "check", "--quick", "--ops", ops, "--out", str(tmp_path), timeout=600
    )
    result = json.loads(next(tmp_path.glob("fp8_check*.json")).read_text())
    assert result["failures"] == []
    assert {(r["op"], r["dtype"]) for r in result["rows"]} == {
        (op, d) for op in ops.split(",") for d in ("float32", "float16", "bfloat16")
    }
