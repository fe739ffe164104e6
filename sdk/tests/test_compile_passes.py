"""opcore.compile: ops stay one node, in-place functionalization and donation, fusion
passes, clone elimination (real torch.compile, mode "eager": AOTAutograd without Inductor
code generation, to keep the suite fast)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

import opcore.compile as oc
from opcore.compile.passes import DonationError
from opcore.ir import ops
from opcore.ir.rope import build_cos_sin_cache
from opcore.testing.ir import temporary_impl


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _capture():
    graphs = {}

    def fw(gm, _inputs):
        graphs["aot"] = gm
        return gm.forward

    aot = aot_autograd(fw_compiler=fw)

    def backend(gm, inputs):
        graphs["dynamo"] = gm
        return aot(gm, inputs)

    return backend, graphs


def _targets(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_ops_are_one_node_through_dynamo_and_aot_autograd():
    def f(x, r, w):
        y = ops.rms_norm(x, w, 1e-6)
        a, b = ops.fused_add_rms_norm(y, r, w, 1e-6)
        return ops.silu_and_mul(torch.cat([a, b], dim=-1))

    backend, graphs = _capture()
    x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    with torch.no_grad():
        torch.compile(f, backend=backend, fullgraph=True)(x, r, w)
    for stage in ("dynamo", "aot"):
        targets = _targets(graphs[stage])
        ir = [t for t in targets if "opcore_ir" in t]
        assert ir == [
            "opcore_ir.rms_norm.default",
            "opcore_ir.fused_add_rms_norm.default",
            "opcore_ir.silu_and_mul.default",
        ], (stage, targets)
        # the native functions were not traced into the graph
        assert not any("rsqrt" in t or "silu" in t.replace("silu_and_mul", "") for t in targets), (
            stage,
            targets,
        )


def _donating(x, r, w):
    h = x * 2
    out, res = ops.fused_add_rms_norm.maybe_inplace(h, r, w, 1e-6)
    return out + res


def test_maybe_inplace_is_functionalized_and_donated_inputs_recorded():
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8)
    want = _donating(x.clone(), r.clone(), w)
    be = oc.backend(mode="eager", fusion=False)
    with torch.no_grad():
        got = torch.compile(_donating, backend=be, fullgraph=True)(x, r.clone(), w)
    torch.testing.assert_close(got, want)
    record = be.last_record
    assert record.donated_inputs == [1]  # r (placeholders: x, r, w); h is made in the graph
    assert record.by_op() == {"fused_add_rms_norm": ["native"]}


def test_activation_used_after_donation_is_an_error_naming_the_node():
    def bad(x, r, w):
        h = x * 2
        out, res = ops.fused_add_rms_norm.maybe_inplace(h, r, w, 1e-6)
        return out + h  # h was donated

    with torch.no_grad(), pytest.raises(Exception) as info:
        torch.compile(bad, backend=oc.backend(mode="eager"), fullgraph=True)(
            torch.randn(2, 8), torch.randn(2, 8), torch.randn(8)
        )
    chain, exc = [], info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    donation = [e for e in chain if isinstance(e, DonationError)]
    assert donation, chain
    message = str(donation[0])
    assert "'x'" in message and "%h" in message and "%add" in message and "maybe_inplace" in message


def test_add_rms_norm_fusion_fires_and_keeps_the_output():
    def f(x, res, w, lin):
        h = x @ lin
        s = h + res
        return ops.rms_norm(s, w, 1e-5), s

    x, res, w, lin = torch.randn(5, 16), torch.randn(5, 16), torch.randn(16), torch.randn(16, 16)
    want = f(x, res, w, lin)
    for fusion in (True, False):
        torch._dynamo.reset()
        be = oc.backend(mode="eager", fusion=fusion)
        with torch.no_grad():
            got = torch.compile(f, backend=be, fullgraph=True)(x, res, w, lin)
        torch.testing.assert_close(got, want)
        ops_lowered = be.last_record.by_op()
        if fusion:
            assert be.last_record.fusions == {"fuse_add_rms_norm": 1}
            assert ops_lowered == {"fused_add_rms_norm": ["native"]}
        else:
            assert be.last_record.fusions == {}
            assert ops_lowered == {"rms_norm": ["native"]}


def _qkv_chain(qkv, positions, qw, kw, cache):
    heads, kv_heads, d = 4, 2, 16
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q = ops.rms_norm(q.unflatten(-1, (heads, d)), qw, 1e-6).flatten(-2)
    k = ops.rms_norm(k.unflatten(-1, (kv_heads, d)), kw, 1e-6).flatten(-2)
    q, k = ops.rotary_embedding(positions, q, k, d, cache, True)
    return q, k, v * 1.0


def test_split_qkv_rmsnorm_rope_fusion_fires_and_keeps_the_output():
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(6, 128, generator=g)
    positions = torch.randint(0, 64, (6,), generator=g)
    qw, kw = torch.randn(16, generator=g), torch.randn(16, generator=g)
    cache = build_cos_sin_cache(16, 64)
    want = _qkv_chain(qkv, positions, qw, kw, cache)
    be = oc.backend(mode="eager", fusion=True)
    with torch.no_grad():
        got = torch.compile(_qkv_chain, backend=be, fullgraph=True)(qkv, positions, qw, kw, cache)
    assert be.last_record.fusions == {"fuse_split_qkv_rmsnorm_rope": 1}
    assert be.last_record.by_op() == {"split_qkv_rmsnorm_rope": ["native"]}
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- clone elimination
# A real in-place kernel registered with torch.library, as a vendor's C++/NPU op would be.
_lib = torch.library.Library("opcore_compile_test", "FRAGMENT")
_lib.define(
    "fused_add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, float eps) -> ()"
)


def _inplace_kernel(x, residual, weight, eps):
    out, res = ops.fused_add_rms_norm.native(x, residual, weight, eps)
    residual.copy_(res)
    x.copy_(out)


_lib.impl("fused_add_rms_norm_", _inplace_kernel, "CompositeExplicitAutograd")
torch.library.register_fake(
    "opcore_compile_test::fused_add_rms_norm_", lambda x, residual, weight, eps: None, lib=_lib
)


def _inplace_provider(x, x_residual, weight, epsilon, variance_size=None):
    torch.ops.opcore_compile_test.fused_add_rms_norm_(x, x_residual, weight, epsilon)
    return x, x_residual


@pytest.fixture
def inplace_provider():
    with (
        temporary_impl(ops.fused_add_rms_norm, "test_inplace", _inplace_provider, inplace=True),
        ops.fused_add_rms_norm.set_priority(["test_inplace"]),
    ):
        yield


def test_clones_removed_for_dead_intermediates_and_kept_for_live_ones(inplace_provider):
    def dead(x, r, w):
        a, b = x * 2, r * 3
        out, res = ops.fused_add_rms_norm(a, b, w, 1e-6)
        return out, res

    def live(x, r, w):
        a, b = x * 2, r * 3
        out, res = ops.fused_add_rms_norm(a, b, w, 1e-6)
        return out + a, res  # a is read after the call: its clone must stay

    x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    for fn, removed in ((dead, 2), (live, 1)):
        torch._dynamo.reset()
        want = fn(x, r, w)
        be = oc.backend(mode="eager", fusion=False)
        with torch.no_grad():
            got = torch.compile(fn, backend=be, fullgraph=True)(x, r, w)
        torch.testing.assert_close(got, want)
        record = be.last_record
        assert record.by_op() == {"fused_add_rms_norm": ["test_inplace"]}
        assert record.lowered[0].inplace and record.lowered[0].how == "traced"
        assert len(record.clones_removed) == removed, record
        if removed == 1:
            assert any("used at or after" in why for why in record.clones_kept.values()), record


def test_clones_removed_only_for_donated_graph_inputs(inplace_provider):
    def donate(x, r, w):
        return ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)

    def keep(x, r, w):
        return ops.fused_add_rms_norm(x, r, w, 1e-6)

    x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    want = ops.fused_add_rms_norm.native(x, r, w, 1e-6)

    be = oc.backend(mode="eager", fusion=False)
    xs, rs = x.clone(), r.clone()
    with torch.no_grad():
        got = torch.compile(keep, backend=be, fullgraph=True)(xs, rs, w)
    torch.testing.assert_close(got, want)
    assert be.last_record.clones_removed == []
    assert torch.equal(xs, x) and torch.equal(rs, r)  # inputs not donated: untouched

    torch._dynamo.reset()
    be = oc.backend(mode="eager", fusion=False)
    xs, rs = x.clone(), r.clone()
    with torch.no_grad():
        got = torch.compile(donate, backend=be, fullgraph=True)(xs, rs, w)
    torch.testing.assert_close(got, want)
    assert be.last_record.donated_inputs == [0, 1]
    assert len(be.last_record.clones_removed) == 2
    # zero-copy: the kernel wrote the donated inputs, as maybe_inplace allows
    torch.testing.assert_close(xs, want[0])


def test_training_graphs_are_refused_with_a_clear_error():
    w = torch.randn(8, requires_grad=True)
    with pytest.raises(Exception, match="inference"):
        torch.compile(lambda x: ops.rms_norm(x, w, 1e-6), backend=oc.backend(mode="eager"))(
            torch.randn(2, 8)
        )
