"""Integer outputs (the routers' expert ids) are compared exactly by ``numerics``: a
relative tolerance would let id 255 pass as 252 in bfloat16."""

from __future__ import annotations

import types

import pytest
import torch

from opcore_conformance.case import CheckFailed, Tolerance
from opcore_conformance.checks.numerics import check_outputs

CTX = types.SimpleNamespace(device=torch.device("cpu"))
BF16 = Tolerance(1e-2, 1.6e-2)


def outputs(ids):
    return torch.full((2, 2), 0.5), torch.tensor(ids, dtype=torch.int32)


def test_equal_ids_pass():
    want = outputs([[255, 3], [0, 7]])
    ref = (want[0].double(), want[1])
    metrics = check_outputs(CTX, want, want, ref, BF16, ref_dtype="float64")
    assert metrics["mismatched"] == 0


def test_an_id_off_by_three_fails_where_the_float_tolerance_would_pass():
    want = outputs([[255, 3], [0, 7]])
    got = outputs([[252, 3], [0, 7]])
    assert abs(252 - 255) <= BF16.atol + BF16.rtol * 255  # the float bound would accept it
    with pytest.raises(CheckFailed, match=r"out\[1\]: 1/4 elements differ \(integers: exact\)"):
        check_outputs(CTX, got, want, (want[0].double(), want[1]), BF16, ref_dtype="float64")
