"""The per-call fast path (`opcore.ir.dispatch`): a call signature seen before is served by
what served it, and anything that could change the answer takes the full path again.

Two kinds of provider are used: a planted one whose ``bind`` records each binding and
whose replay computes with what it bound (so a replay reused for another dtype, layout or
alignment gives a wrong answer the test sees), and the real Triton provider under Triton's
interpreter, whose replays go through `opcore.kernels.triton._bound`.
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch

from opcore.ir import ops
from opcore.settings import create_config, set_current_config
from opcore.testing.interpreter import UNDER_TRITON_INTERPRETER, rerun_under_triton_interpreter
from opcore.testing.ir import temporary_op


def ir_fast_op(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x * scale``, in x's dtype."""
    return x * scale


class Counting:
    """A provider of ``ir_fast_op`` with a ``bind``: the replay computes with the dtype,
    strides and alignment it was bound for, so reusing it for other ones is wrong."""

    def __init__(self) -> None:
        self.binds = 0
        self.replays = 0

    def fn(self, x, scale):
        return x * scale

    def bind(self, fn):
        return functools.partial(self.bind_call, fn)

    def bind_call(self, fn, x, scale):
        self.binds += 1
        dtype, shape, stride, offset = x.dtype, tuple(x.shape), x.stride(), x.storage_offset()
        aligned = x.data_ptr() % 16 == 0

        def replay(x, scale):
            self.replays += 1
            # What a kernel bound to this signature would read: the bound layout.
            view = torch.as_strided(x, shape, stride, offset if aligned else x.storage_offset())
            return (view.to(dtype) * scale).to(dtype)

        return fn(x, scale), replay


@contextlib.contextmanager
def counting_op():
    counting = Counting()
    with temporary_op(ir_fast_op) as op:
        op.register_impl("counting", bind=counting.bind)(counting.fn)
        with op.set_priority(["counting"]):
            yield op, counting


def test_a_repeated_signature_replays_without_a_new_bind():
    with counting_op() as (op, c):
        x = torch.randn(4, 8)
        for _ in range(5):
            assert torch.equal(op(x, 2.0), x * 2.0)
        assert (c.binds, c.replays) == (1, 4)
        y = torch.randn(4, 8)  # same signature, new data: replayed, right answer
        assert torch.equal(op(y, 2.0), y * 2.0) and c.replays == 5


@pytest.mark.parametrize(
    "variant",
    [
        "dtype",
        "non_contiguous",
        "misaligned",
        "shape",
        "scalar_value",
        "scalar_type",
    ],
)
def test_another_signature_takes_the_full_path(variant):
    with counting_op() as (op, c):
        x = torch.randn(4, 8)
        op(x, 2.0)
        assert c.binds == 1
        if variant == "dtype":
            args = (x.half(), 2.0)
        elif variant == "non_contiguous":
            args = (torch.randn(8, 4).t(), 2.0)  # same shape, other strides
        elif variant == "misaligned":
            buf = torch.randn(4 * 8 + 1)
            args = (buf[1:].view(4, 8), 2.0)  # 4 bytes past a 16-byte boundary
            assert args[0].data_ptr() % 16 != 0
        elif variant == "shape":
            args = (torch.randn(5, 8), 2.0)
        elif variant == "scalar_value":
            args = (x, 3.0)
        else:
            args = (x, 2)  # an int, not the float bound
        got = op(*args)
        assert c.binds == 2, "a new signature must bind anew"
        assert got.dtype == args[0].dtype and torch.equal(got, args[0] * args[1])
        assert torch.equal(op(*args), args[0] * args[1])  # and its own replay is right
        assert c.binds == 2 and c.replays == 1


def test_priority_config_property_and_registry_changes_take_the_full_path():
    with counting_op() as (op, c):
        x = torch.randn(4, 8)
        op(x, 2.0)
        op(x, 2.0)
        assert (c.binds, c.replays) == (1, 1)
        # another priority: native serves the same signature
        with op.set_priority(["native"]):
            assert op.dispatch(x, 2.0).provider == "native"
            assert torch.equal(op(x, 2.0), x * 2.0)
        assert c.replays == 1
        # back in the counting block: its route, and its bound replay, are reused
        op(x, 2.0)
        assert (c.binds, c.replays) == (1, 2)
    with temporary_op(ir_fast_op) as op:
        counting = Counting()
        op.register_impl("counting", bind=counting.bind)(counting.fn)
        cfg = create_config(ir_op_priority={op.name: ["counting"]}, env={})
        with set_current_config(cfg):
            op(x, 2.0)
            op(x, 2.0)
            assert (counting.binds, counting.replays) == (1, 1)
        # the default config: no user list, native first
        assert op.dispatch(x, 2.0).provider == "native"
        op(x, 2.0)
        assert counting.replays == 1
        # a required property the provider lacks: the chain changes, native serves
        required = create_config(
            ir_op_priority={op.name: ["counting"]}, required_properties=["batch_invariant"], env={}
        )
        op.declare_native_properties({"batch_invariant"})
        with set_current_config(required):
            assert op.dispatch(x, 2.0).provider == "native"
            assert torch.equal(op(x, 2.0), x * 2.0)
        assert counting.replays == 1
        # the provider unregistered: the next call takes the full path
        with set_current_config(cfg):
            op(x, 2.0)  # declare_native_properties moved the generation: a new bind
            assert (counting.binds, counting.replays) == (2, 1)
            op(x, 2.0)
            assert counting.replays == 2
            op.unregister_impl("counting")
            # the full path sees the list name a provider that is gone (no stale replay)
            with pytest.raises(ValueError, match="'counting'"):
                op(x, 2.0)
            assert counting.replays == 2
        assert torch.equal(op(x, 2.0), x * 2.0)  # the default config: native


def test_a_tuning_table_reload_moves_the_generation(monkeypatch):
    from opcore.ir.dispatch import registry_generation
    from opcore.tuning import runtime

    with counting_op() as (op, c):
        x = torch.randn(4, 8)
        op(x, 2.0)
        op(x, 2.0)
        before = registry_generation()
        monkeypatch.setenv("OPCORE_TUNING", "off")
        runtime.reload()
        assert registry_generation() != before
        op(x, 2.0)
        assert c.binds == 2, "after a reload the bound replay is not reused"
        monkeypatch.delenv("OPCORE_TUNING")
        runtime.reload()


def test_a_chain_that_cannot_bind_checks_each_call_and_remembers_nothing():
    # No provider binds: the validator and supports_args run per call (cheaper than a
    # signature): each call is chosen afresh and no signature is remembered.
    def small(x, scale):
        return x.shape[0] <= 4

    with temporary_op(ir_fast_op) as op:
        op.register_impl("small", supports_args=small)(lambda x, scale: x * scale + 0.0)
        with op.set_priority(["small", "native"]):
            for rows in (2, 8, 2):
                x = torch.randn(rows, 3)
                assert torch.equal(op(x, 2.0), x * 2.0)
                want = "small" if rows <= 4 else "native"
                assert op.dispatch(x, 2.0).provider == want
            assert not op.route().keyed and op.route().bound == {}


def test_logged_dispatch_never_replays(monkeypatch):
    monkeypatch.setenv("OPCORE_LOG_DISPATCH", "1")
    with counting_op() as (op, c):
        x = torch.randn(4, 8)
        for _ in range(3):
            op(x, 2.0)
        assert c.replays == 0 and c.binds == 0  # every call takes the full path, unbound


def test_invalid_arguments_are_checked_on_every_call():
    # A bad call never enters the signature map, so the validator sees each one.
    for _ in range(3):
        with pytest.raises(ValueError, match="rms_norm"):
            ops.rms_norm(torch.randn(4, 8), torch.randn(7), 1e-6)


def test_set_priority_block_reuses_the_route():
    x, w = torch.randn(2, 8), torch.randn(8)
    with ops.rms_norm.set_priority(["native"]):
        ops.rms_norm(x, w, 1e-6)
        route = ops.rms_norm.route()
    for _ in range(3):
        with ops.rms_norm.set_priority(["native"]):
            ops.rms_norm(x, w, 1e-6)
            assert ops.rms_norm.route() is route  # no new decision for the same list


# --------------------------------------------------------------------------- Triton
if not UNDER_TRITON_INTERPRETER:

    def test_triton_bound_replays_under_the_interpreter():
        rerun_under_triton_interpreter(__file__)

else:
    import opcore.kernels.triton  # noqa: F401  (registers the provider under the interpreter)
    from opcore.kernels.triton import _bound

    def _bound_fns(op):
        return list(op.route().bound.values())

    def test_triton_replay_matches_the_full_path_for_every_variant():
        op = ops.rms_norm
        w = torch.randn(64)
        with op.set_priority(["triton", "native"]):
            x = torch.randn(6, 64)
            first = op(x, w, 1e-6)
            fns = _bound_fns(op)
            assert len(fns) == 1 and getattr(fns[0], "__wrapped__", None) is not None
            assert fns[0].__qualname__.startswith("_interpreted_replay")
            y = torch.randn(6, 64)
            assert torch.allclose(op(y, w, 1e-6), op.native(y, w, 1e-6), atol=1e-5)
            assert torch.equal(op(x, w, 1e-6), first)
            wide = torch.randn(6, 128)
            buf = torch.randn(6 * 64 + 1)
            for z in (
                x.half(),  # another dtype
                wide[:, 32:96],  # strided rows, offset by 32 columns
                buf[1:].view(6, 64),  # misaligned
                torch.randn(7, 64),  # another shape
            ):
                wz = w.to(z.dtype)
                for _ in range(2):  # the full path, then the replay
                    got = op(z, wz, 1e-6)
                    ref = op.native(z.float(), wz.float(), 1e-6).to(z.dtype)
                    assert got.dtype == z.dtype
                    assert torch.allclose(got.float(), ref.float(), atol=2e-3, rtol=2e-3)
            assert len(_bound_fns(op)) == 5

    def test_triton_replay_of_strided_in_place_inputs_and_views():
        # rotary: positions reshaped inside the provider (a view of an argument); q/k as
        # column slices of one qkv buffer.
        op = ops.rotary_embedding
        heads, kv, hs, n = 4, 2, 32, 5
        cache = torch.randn(64, hs)
        with op.set_priority(["triton", "native"]):
            for _ in range(3):
                qkv = torch.randn(n, (heads + 2 * kv) * hs)
                q, k = qkv[:, : heads * hs], qkv[:, heads * hs : (heads + kv) * hs]
                pos = torch.randint(0, 64, (n,))
                got_q, got_k = op(pos, q, k, hs, cache, True)
                ref_q, ref_k = op.native(pos, q, k, hs, cache, True)
                assert torch.allclose(got_q, ref_q, atol=1e-5)
                assert torch.allclose(got_k, ref_k, atol=1e-5)
            fns = _bound_fns(op)
            assert len(fns) == 1 and fns[0].__qualname__.startswith("_interpreted_replay")

    def test_a_provider_passing_an_unrecorded_tensor_is_not_bound():
        calls = []

        def doubles(x, scale):
            calls.append(1)
            return x * 2.0 * scale  # a torch op's result: nothing a replay could rebuild

        bind = _bound.binder(doubles)
        x = torch.randn(3)
        result, replay = bind(x, 1.0)
        assert replay is None and torch.equal(result, x * 2.0)

    def test_triton_maybe_inplace_replays_the_in_place_kernel():
        op = ops.fused_add_rms_norm
        w = torch.randn(64)
        with op.set_priority(["triton", "native"]):
            for _ in range(3):
                x, r = torch.randn(4, 64), torch.randn(4, 64)
                ref_out, ref_res = op.native(x, r, w, 1e-6)
                xi, ri = x.clone(), r.clone()
                out, res = op.maybe_inplace(xi, ri, w, 1e-6)
                assert out is xi and res is ri  # written where they lie
                assert torch.allclose(out, ref_out, atol=1e-5)
                assert torch.allclose(res, ref_res, atol=1e-6)
            fns = list(op.route().bound_inplace.values())
            assert len(fns) == 1 and fns[0].__qualname__.startswith("_interpreted_replay")

    @pytest.mark.parametrize(
        "name", ["dynamic_per_token_scaled_fp8_quant", "fused_add_rms_norm_static_fp8_quant"]
    )
    def test_triton_fp8_replays_write_through_views_of_their_outputs(name):
        # Under the interpreter the fp8 kernels write codes through a uint8 view of each
        # output: a view of an allocation, in another dtype, rebuilt on every replay.
        op = getattr(ops, name)
        with op.set_priority(["triton", "native"]):
            n = 0
            for a, b in zip(
                op.sample_inputs("cpu", torch.bfloat16),
                op.sample_inputs("cpu", torch.bfloat16),
                strict=True,
            ):
                if a.kwargs:
                    continue
                first, second = op(*a.args), op(*b.args)
                for x, y in zip(first, second, strict=True):
                    if x is None:
                        continue
                    if x.dtype.itemsize == 1:
                        x, y = x.view(torch.uint8), y.view(torch.uint8)
                    assert torch.equal(x.float().nan_to_num(7.0), y.float().nan_to_num(7.0))
                n += 1
            replays = [
                f
                for f in op.route().bound.values()
                if f.__qualname__.startswith("_interpreted_replay")
            ]
            assert n >= 10 and len(replays) >= n // 2
