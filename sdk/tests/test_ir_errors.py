"""Bad input gets a ValueError/TypeError naming the op and the argument, before any
provider runs (eager and traced paths alike)."""

from __future__ import annotations

import pytest
import torch

from opcore.ir import ops
from opcore.ir.rope import build_cos_sin_cache
from opcore.testing.ir import temporary_impl

X = torch.randn(3, 8)
W = torch.ones(8)
META_W = torch.ones(8, device="meta")
CACHE = build_cos_sin_cache(16, 32)
POS = torch.arange(3)
Q = torch.randn(3, 2 * 16)
K = torch.randn(3, 16)
QKV = torch.randn(3, (2 + 2) * 16)


def _raises(exc, op, arg, fn, *args, match=None):
    with pytest.raises(exc) as info:
        fn(*args)
    message = str(info.value)
    assert f"opcore.ir.ops.{op}" in message and f"'{arg}'" in message, message
    if match:
        assert match in message, message


CASES = [
    ("rms_norm", "x", (X.to(torch.int32), W.int(), 1e-6), "dtype int32"),
    ("rms_norm", "weight", (X, W.to(torch.bfloat16), 1e-6), "dtype bfloat16"),
    ("rms_norm", "weight", (X, META_W, 1e-6), "meta"),
    ("rms_norm", "weight", (X, torch.ones(7), 1e-6), "(7,)"),
    ("rms_norm", "variance_size", (X, W, 1e-6, 9), "larger than"),
    ("rms_norm", "x", (torch.tensor(1.0), None, 1e-6), "0 dims"),
    ("fused_add_rms_norm", "x_residual", (X, torch.randn(3, 4), W, 1e-6), "shape"),
    ("fused_add_rms_norm", "x_residual", (X, X.half(), W, 1e-6), "dtype float16"),
    ("silu_and_mul", "x", (torch.randn(2, 7),), "must be even"),
    ("gelu_and_mul", "x", (torch.randn(2, 9),), "must be even"),
    ("gelu_and_mul", "approximate", (X, "fast"), "'fast'"),
    (
        "rotary_embedding",
        "query",
        (POS, torch.randn(3, 40), K, 16, CACHE, True),
        "not a multiple of head_size 16",
    ),
    ("rotary_embedding", "key", (POS, Q, torch.randn(3, 20), 16, CACHE, True), "not a multiple"),
    ("rotary_embedding", "key", (POS, Q, K.half(), 16, CACHE, True), "dtype"),
    (
        "rotary_embedding",
        "positions",
        (torch.tensor([0, 5, 32]), Q, K, 16, CACHE, True),
        "position 32",
    ),
    (
        "rotary_embedding",
        "positions",
        (torch.tensor([0, -1, 2]), Q, K, 16, CACHE, True),
        "position -1",
    ),
    ("rotary_embedding", "positions", (POS.float(), Q, K, 16, CACHE, True), "int32 or int64"),
    ("rotary_embedding", "positions", (POS.to("meta"), Q, K, 16, CACHE, True), "meta"),
    (
        "rotary_embedding",
        "cos_sin_cache",
        (POS, Q, K, 16, torch.randn(32, 15), True),
        "must be even",
    ),
    (
        "rotary_embedding",
        "cos_sin_cache",
        (POS, Q, K, 8, build_cos_sin_cache(16, 32), True),
        "larger than head_size 8",
    ),
    (
        "rotary_embedding",
        "cos_sin_cache",
        (POS, Q, K, 16, CACHE.to(torch.bfloat16), True),
        "float32",
    ),
    ("rotary_embedding", "query", (POS, torch.randn(4, 32), K, 16, CACHE, True), "positions.shape"),
    (
        "split_qkv_rmsnorm_rope",
        "qkv",
        (QKV, None, None, 1e-6, POS, CACHE, 2, 2, 16, True),
        "(2 + 2 * 2) * 16 = 96",
    ),
    (
        "split_qkv_rmsnorm_rope",
        "q_weight",
        (QKV, torch.ones(8), None, 1e-6, POS, CACHE, 2, 1, 16, True),
        "(16,)",
    ),
    (
        "split_qkv_rmsnorm_rope",
        "positions",
        (QKV, None, None, 1e-6, torch.tensor([1, 2, 99]), CACHE, 2, 1, 16, True),
        "position 99",
    ),
    (
        "split_qkv_rmsnorm_rope",
        "num_heads",
        (QKV, None, None, 1e-6, POS, CACHE, 0, 1, 16, True),
        "positive",
    ),
]


@pytest.mark.parametrize(
    "op_name, arg, args, match", CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)]
)
def test_bad_input_names_op_and_argument(op_name, arg, args, match):
    _raises(ValueError, op_name, arg, getattr(ops, op_name), *args, match=match)


def test_wrong_python_types_are_type_errors():
    _raises(TypeError, "rms_norm", "x", ops.rms_norm, [1.0, 2.0], None, 1e-6)
    _raises(TypeError, "rms_norm", "epsilon", ops.rms_norm, X, W, "1e-6")
    _raises(TypeError, "rotary_embedding", "is_neox", ops.rotary_embedding, POS, Q, K, 16, CACHE, 1)


def test_validation_runs_before_any_provider():
    calls = []

    def silu_and_mul(x):
        calls.append(x)
        return x

    with temporary_impl(ops.silu_and_mul, "ir_test_spy", silu_and_mul):
        with ops.silu_and_mul.set_priority(["ir_test_spy"]):
            with pytest.raises(ValueError):
                ops.silu_and_mul(torch.randn(2, 5))
            with pytest.raises(ValueError):
                torch.ops.opcore_ir.silu_and_mul(torch.randn(2, 3))
    assert calls == []


def test_traced_path_validates_too():
    with pytest.raises(ValueError, match=r"opcore.ir.ops.silu_and_mul: argument 'x'"):
        torch.ops.opcore_ir.silu_and_mul(torch.randn(2, 7))
    from torch.fx.experimental.proxy_tensor import make_fx

    with pytest.raises(ValueError, match="'weight'"):
        make_fx(lambda x, w: ops.rms_norm(x, w, 1e-6), tracing_mode="fake")(X, torch.ones(7))
