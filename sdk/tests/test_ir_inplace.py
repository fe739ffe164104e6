"""The default overload never mutates; maybe_inplace may (and then aliases)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from opcore.ir import ops
from opcore.testing.ir import temporary_impl


def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
    """An in-place provider: writes the residual into x_residual and the output into x."""
    x_residual.add_(x)
    var = x_residual.float().pow(2).mean(-1, keepdim=True)
    x.copy_(x_residual.float() * torch.rsqrt(var + epsilon) * weight.float())
    return x, x_residual


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    """An in-place rotary provider (delegates the math, then writes into the inputs)."""
    q, k = ops.rotary_embedding.native(positions, query, key, head_size, cos_sin_cache, is_neox)
    query.copy_(q)
    if key is not None:
        key.copy_(k)
    return query, key


@pytest.fixture
def inplace_provider():
    with temporary_impl(
        ops.fused_add_rms_norm, "ir_test_inplace", fused_add_rms_norm, inplace=True
    ):
        with ops.fused_add_rms_norm.set_priority(["ir_test_inplace"]):
            yield


def _inputs():
    g = torch.Generator().manual_seed(1)
    return (
        torch.randn(4, 16, generator=g),
        torch.randn(4, 16, generator=g),
        torch.rand(16, generator=g) + 0.5,
    )


def test_default_overload_does_not_mutate_with_inplace_provider(inplace_provider):
    x, r, w = _inputs()
    x0, r0 = x.clone(), r.clone()
    assert ops.fused_add_rms_norm.dispatch(x, r, w, 1e-6).provider == "ir_test_inplace"
    out, res = ops.fused_add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(x, x0) and torch.equal(r, r0)
    ref_out, ref_res = ops.fused_add_rms_norm.native(x0, r0, w, 1e-6)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(res, ref_res)
    # the torch op (traced path) keeps the contract too, and returns no alias
    out2, res2 = torch.ops.opcore_ir.fused_add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(x, x0) and torch.equal(r, r0)
    assert out2.data_ptr() not in (x.data_ptr(), r.data_ptr())


def test_maybe_inplace_may_alias_the_donated_activations(inplace_provider):
    x, r, w = _inputs()
    ref_out, ref_res = ops.fused_add_rms_norm.native(x.clone(), r.clone(), w, 1e-6)
    out, res = ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
    assert out.data_ptr() == x.data_ptr() and res.data_ptr() == r.data_ptr()
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(res, ref_res)


def test_maybe_inplace_with_functional_provider_returns_fresh_tensors():
    x, r, w = _inputs()
    x0 = x.clone()
    out, res = ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
    assert torch.equal(x, x0) and out.data_ptr() != x.data_ptr()


def test_rotary_default_overload_does_not_mutate_query_or_key():
    sample = next(
        s for s in ops.rotary_embedding.sample_inputs() if s.name.startswith("strided_qkv")
    )
    positions, q, k, head_size, cache, is_neox = sample.args
    before = sample.clone()
    with temporary_impl(ops.rotary_embedding, "ir_test_inplace", rotary_embedding, inplace=True):
        with ops.rotary_embedding.set_priority(["ir_test_inplace"]):
            q_out, k_out = ops.rotary_embedding(*sample.args)
            for (_, t), (_, t0) in zip(sample.tensors(), before.tensors(), strict=True):
                assert torch.equal(t, t0)
            ref_q, ref_k = ops.rotary_embedding.native(*before.args)
            torch.testing.assert_close(q_out, ref_q)
            torch.testing.assert_close(k_out, ref_k)
            q2, k2 = ops.rotary_embedding.maybe_inplace(
                positions, q, None, head_size, cache, is_neox
            )
            assert k2 is None and q2.data_ptr() == q.data_ptr()


def test_maybe_inplace_only_for_allow_inplace_ops():
    with pytest.raises(TypeError, match="allow_inplace"):
        ops.rms_norm.maybe_inplace(torch.ones(2, 2), None, 1e-6)


def test_traced_maybe_inplace_is_one_mutable_node_and_rebuilds_none_key():
    x, r, w = _inputs()
    g = make_fx(lambda x, r, w: ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6))(x, r, w)
    targets = [
        n.target for n in g.graph.nodes if n.op == "call_function" and "opcore_ir" in str(n.target)
    ]
    assert targets == [torch.ops.opcore_ir.fused_add_rms_norm.maybe_inplace]
    schema = torch.ops.opcore_ir.fused_add_rms_norm.maybe_inplace._schema
    assert [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write] == [
        "x",
        "x_residual",
    ]

    sample = next(iter(ops.rotary_embedding.sample_inputs()))
    positions, q, _, head_size, cache, is_neox = sample.args
    out = make_fx(
        lambda p, q, c: ops.rotary_embedding.maybe_inplace(p, q, None, head_size, c, is_neox)
    )(positions, q, cache)
    q_out, k_out = out(positions, q.clone(), cache)
    assert k_out is None
    torch.testing.assert_close(
        q_out, ops.rotary_embedding.native(positions, q, None, head_size, cache, is_neox)[0]
    )


def test_functional_kernel_serves_the_default_overload_without_clones():
    calls = []

    def out_of_place(x, x_residual, weight, epsilon, variance_size=None):
        calls.append("functional")
        return ops.fused_add_rms_norm.native(x, x_residual, weight, epsilon, variance_size)

    def in_place(x, x_residual, weight, epsilon, variance_size=None):
        calls.append("inplace")
        return fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size)

    x, r, w = _inputs()
    x0, r0 = x.clone(), r.clone()
    with temporary_impl(
        ops.fused_add_rms_norm, "ir_test_pair", in_place, inplace=True, functional=out_of_place
    ):
        with ops.fused_add_rms_norm.set_priority(["ir_test_pair"]):
            out, res = ops.fused_add_rms_norm(x, r, w, 1e-6)
            assert calls == ["functional"]
            assert torch.equal(x, x0) and torch.equal(r, r0)
            ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
            assert calls == ["functional", "inplace"]
            torch.testing.assert_close(x, out)
            torch.testing.assert_close(r, res)
        before = ops.fused_add_rms_norm.identity_hash("ir_test_pair")
    with temporary_impl(ops.fused_add_rms_norm, "ir_test_pair", in_place, inplace=True):
        # Without the out-of-place kernel the provider is a different computation path.
        assert ops.fused_add_rms_norm.identity_hash("ir_test_pair") != before


def test_functional_needs_inplace_and_the_same_parameters():
    def ok(x, x_residual, weight, epsilon, variance_size=None):
        return x, x_residual

    def wrong(x, residual, weight, epsilon, variance_size=None):
        return x, residual

    with pytest.raises(ValueError, match="gives functional= but is not inplace=True"):
        ops.fused_add_rms_norm.register_impl("ir_test_bad", functional=ok)(ok)
    with pytest.raises(ValueError, match="functional of provider 'ir_test_bad'"):
        ops.fused_add_rms_norm.register_impl("ir_test_bad", inplace=True, functional=wrong)(ok)
    assert "ir_test_bad" not in ops.fused_add_rms_norm.impls
