"""The reference layers compute their ops, with cos/sin caches built from the formula."""

from __future__ import annotations

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from opcore.ir import ops
from opcore.layers import (
    GeluAndMul,
    QKNormRoPE,
    RMSNorm,
    RotaryEmbedding,
    SiluAndMul,
    build_cos_sin_cache,
)


def test_rms_norm_layer():
    layer = RMSNorm(16, eps=1e-5, dtype=torch.float32)
    with torch.no_grad():
        layer.weight.copy_(torch.linspace(0.5, 1.5, 16))
    x, r = torch.randn(3, 16), torch.randn(3, 16)
    torch.testing.assert_close(layer(x), ops.rms_norm.native(x, layer.weight, 1e-5))
    out, res = layer(x, r)
    ref_out, ref_res = ops.fused_add_rms_norm.native(x, r, layer.weight, 1e-5)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(res, ref_res)
    partial = RMSNorm(16, var_hidden_size=8, has_weight=False)
    assert partial.weight is None
    torch.testing.assert_close(partial(x), ops.rms_norm.native(x, None, 1e-6, 8))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gated_activation_layers(approximate):
    x = torch.randn(4, 10)
    torch.testing.assert_close(SiluAndMul()(x), ops.silu_and_mul.native(x))
    torch.testing.assert_close(GeluAndMul(approximate)(x), ops.gelu_and_mul.native(x, approximate))
    with pytest.raises(ValueError, match="approximate"):
        GeluAndMul("erf")


def test_cos_sin_cache_matches_formula():
    cache = build_cos_sin_cache(8, 100, rope_theta=500.0)
    assert cache.shape == (100, 8) and cache.dtype == torch.float32
    for p in (0, 1, 37, 99):
        for i in range(4):
            angle = p * 500.0 ** (-2 * i / 8)
            assert math.isclose(cache[p, i].item(), math.cos(angle), abs_tol=1e-6)
            assert math.isclose(cache[p, 4 + i].item(), math.sin(angle), abs_tol=1e-6)
    with pytest.raises(ValueError, match="even"):
        build_cos_sin_cache(7, 10)


@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_layer_partial(is_neox):
    layer = RotaryEmbedding(
        head_size=32, rotary_dim=16, max_position=64, rope_theta=1000.0, is_neox=is_neox
    )
    assert layer.cos_sin_cache.shape == (64, 16)
    assert "cos_sin_cache" not in layer.state_dict()  # rebuilt, not saved
    pos = torch.tensor([3, 0, 63])
    q, k = torch.randn(3, 64), torch.randn(3, 32)
    q_out, k_out = layer(pos, q, k)
    ref_q, ref_k = ops.rotary_embedding.native(pos, q, k, 32, layer.cos_sin_cache, is_neox)
    torch.testing.assert_close(q_out, ref_q)
    torch.testing.assert_close(k_out, ref_k)
    q_only, none = layer(pos, q)
    assert none is None and torch.equal(q_only, q_out)
    with pytest.raises(ValueError, match="rotary_dim"):
        RotaryEmbedding(head_size=32, rotary_dim=48)


def test_qk_norm_rope_layer():
    layer = QKNormRoPE(
        num_heads=4,
        num_kv_heads=2,
        head_size=16,
        eps=1e-6,
        rotary_dim=8,
        max_position=32,
        is_neox=False,
    )
    with torch.no_grad():
        layer.q_weight.copy_(torch.linspace(0.5, 1.5, 16))
        layer.k_weight.copy_(torch.linspace(1.5, 0.5, 16))
    qkv, pos = torch.randn(5, (4 + 4) * 16), torch.tensor([0, 9, 2, 31, 4])
    q, k, v = layer(qkv, pos)
    ref = ops.split_qkv_rmsnorm_rope.native(
        qkv, layer.q_weight, layer.k_weight, 1e-6, pos, layer.cos_sin_cache, 4, 2, 16, False
    )
    for got, want in zip((q, k, v), ref, strict=True):
        torch.testing.assert_close(got, want)


def test_layer_traces_to_one_opcore_node():
    layer = RMSNorm(8)
    g = make_fx(layer)(torch.randn(2, 8))
    targets = [n.target for n in g.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.opcore_ir.rms_norm.default]
