"""opcore.ir.info(): plain data per op for `opcore info`."""

from __future__ import annotations

import json

import pytest
import torch

from opcore.ir import all_ops, info, ops
from opcore.settings import create_config
from opcore.testing.ir import temporary_impl


def test_info_lists_every_op_with_providers_and_priority():
    data = info()
    json.dumps(data)  # plain data
    assert set(data["ops"]) == set(all_ops())
    entry = data["ops"]["rms_norm"]
    assert entry["schema"].startswith("opcore_ir::rms_norm(Tensor x")
    assert entry["effective_priority"][-1] == "native"
    assert {p["name"] for p in entry["providers"]} >= {"native"}
    assert data["ops"]["fused_add_rms_norm"]["activations"] == ["x", "x_residual"]
    assert data["ops"]["rotary_embedding"]["activations"] == ["query", "key"]


@pytest.mark.filterwarnings("ignore::opcore.ir.PriorityWarning")
def test_info_follows_the_given_config_and_reports_errors():
    def silu_and_mul(x):
        return x

    with (
        temporary_impl(
            ops.silu_and_mul, "ir_info_test", silu_and_mul, supports_args=lambda x: x.dim() == 2
        ),
        temporary_impl(ops.silu_and_mul, "ir_info_absent", silu_and_mul, supported=False),
    ):
        data = info(
            create_config(
                ir_op_priority={"silu_and_mul": ["ir_info_test"], "gelu_and_mul": ["nope"]}
            )
        )
        entry = data["ops"]["silu_and_mul"]
        assert (
            entry["effective_priority"] == ["ir_info_test", "native"] and entry["native_appended"]
        )
        assert "ir_info_absent" not in entry["supported_here"]
        assert entry["skipped"]["ir_info_absent"].startswith("not supported")
        assert "'nope'" in data["ops"]["gelu_and_mul"]["error"]
        # the current config is untouched
        assert ops.silu_and_mul.dispatch(torch.ones(2, 2)).provider == "native"
