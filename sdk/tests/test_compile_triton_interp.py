"""opcore.compile with the ``triton`` provider (Triton's CPU interpreter), under Inductor.

The Triton provider's in-place kernels (``fused_add_rms_norm``, ``rotary_embedding``) are
lowered as opaque calls. Inductor treats its post-grad graph as functional and deletes
same-layout clones, so a raw in-place call behind a lowering clone wrote the caller's
tensors: the fused decoder's residual input was overwritten on every call (outputs drifted
from eager, and on a GPU Inductor skipped CUDA graphs for the mutated input). These tests
compile a tiny decoder with fusion and check, against the eager native decoder, the
outputs of repeated calls, that the inputs are untouched, that the graph Inductor receives
has no mutating op, and which kernel form each in-place provider got.

The interpreter is chosen when a kernel is decorated, so it must be on before
`opcore.kernels.triton` is first imported: the collected test re-runs this file in a child
pytest with ``TRITON_INTERPRET=1`` (as ``test_triton_kernels.py`` does).
"""

from __future__ import annotations

import pytest
import torch

from opcore.testing.interpreter import UNDER_TRITON_INTERPRETER, rerun_under_triton_interpreter

INTERPRETED = UNDER_TRITON_INTERPRETER

if not INTERPRETED:

    def test_compile_triton_under_interpreter():
        rerun_under_triton_interpreter(__file__, env={"OMP_NUM_THREADS": "1"})

    # The same defect with a traced in-place provider (a real torch.library mutating op, as
    # a vendor's C++ kernel would be): no Triton needed, so it runs in this process.
    from opcore.ir import ops
    from opcore.testing.ir import temporary_impl

    _lib = torch.library.Library("opcore_compile_interp_test", "FRAGMENT")
    _lib.define("add_rms_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, float eps) -> ()")

    def _add_rms_(x, residual, weight, eps):
        out, res = ops.fused_add_rms_norm.native(x, residual, weight, eps)
        residual.copy_(res)
        x.copy_(out)

    _lib.impl("add_rms_", _add_rms_, "CompositeExplicitAutograd")
    torch.library.register_fake(
        "opcore_compile_interp_test::add_rms_", lambda x, residual, weight, eps: None, lib=_lib
    )

    def _inplace_provider(x, x_residual, weight, epsilon, variance_size=None):
        torch.ops.opcore_compile_interp_test.add_rms_(x, x_residual, weight, epsilon)
        return x, x_residual

    def test_traced_inplace_provider_under_inductor_never_writes_inputs():
        import opcore.compile as oc

        def plain(x, r, w):  # results used further, as in a decoder layer
            out, res = ops.fused_add_rms_norm(x, r, w, 1e-6)
            return out * 2, res + 1

        def donating(x, r, w):  # donation lets eager mode write x and r, never Inductor
            return ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)

        def dead(x, r, w):  # activations made in the graph and dead after the call
            return ops.fused_add_rms_norm(x * 2, r + 1, w, 1e-6)

        x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
        with (
            temporary_impl(
                ops.fused_add_rms_norm, "interp_test_inplace", _inplace_provider, inplace=True
            ),
            ops.fused_add_rms_norm.set_priority(["interp_test_inplace"]),
        ):
            for fn, args in ((plain, (x, r)), (dead, (x * 2, r + 1)), (donating, (x, r))):
                torch._dynamo.reset()
                want = ops.fused_add_rms_norm.native(*args, w, 1e-6)
                if fn is plain:
                    want = (want[0] * 2, want[1] + 1)
                # no FX-graph cache: `donating` is `plain` to Inductor, and the record is checked
                be = oc.backend(
                    mode="inductor", fusion=False, inductor_config={"fx_graph_cache": False}
                )
                xs, rs = x.clone(), r.clone()
                with torch.no_grad():
                    got = torch.compile(fn, backend=be, fullgraph=True)(xs, rs, w)
                torch.testing.assert_close(got, want)
                assert torch.equal(xs, x) and torch.equal(rs, r), f"{fn.__name__}: inputs written"
                assert (
                    be.last_record.lowered[0].inplace and be.last_record.lowered[0].how == "traced"
                )
        torch._dynamo.reset()

else:
    pytest.importorskip("triton")
    import opcore.compile as oc
    import opcore.kernels.triton  # noqa: F401  (registers the provider)
    from opcore.compile.decoder import Decoder, DecoderShape
    from opcore.ir import all_ops
    from opcore.settings import create_config

    SHAPE = DecoderShape(layers=2, hidden=256, heads=4, kv_heads=2, head_size=64, intermediate=256)
    TOKENS = 3

    def _triton_first():
        return create_config(ir_op_priority={name: ["triton", "native"] for name in all_ops()})

    class _GraphSeen:
        """An Inductor post-grad pass that keeps the mutating nodes of the graph it sees
        (after opcore's pass and Inductor's own pattern passes, before reinplacing)."""

        def __init__(self):
            from torch._inductor.custom_graph_pass import CustomGraphPass

            seen = self.mutating = []

            class Pass(CustomGraphPass):
                def __call__(self, graph):
                    for n in graph.nodes:
                        schema = getattr(n.target, "_schema", None)
                        if n.op == "call_function" and schema is not None and schema.is_mutable:
                            seen.append(f"{n.name}: {n.target}")

                def uuid(self):
                    return None  # never served from Inductor's cache: the pass must run

            self.pass_ = Pass()

    def _inputs(dtype):
        g = torch.Generator().manual_seed(1)
        positions = torch.tensor([5, 17, 2])
        hidden = torch.randn(TOKENS, SHAPE.hidden, generator=g).to(dtype)
        return positions, hidden

    def _tolerance(dtype, ref):
        # one or two roundings of the output dtype, scaled to the output's magnitude
        scale = float(ref.abs().max())
        return (1e-4 if dtype == torch.float32 else 4 * 2.0**-8) * max(scale, 1.0)

    @pytest.fixture(autouse=True)
    def _fresh_dynamo():
        torch._dynamo.reset()
        yield
        torch._dynamo.reset()

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
    def test_fused_decoder_under_inductor_matches_eager_and_keeps_inputs(dtype):
        positions, hidden = _inputs(dtype)
        with torch.inference_mode():
            ref = Decoder(SHAPE, impl="native", dtype=dtype).eval()(positions, hidden).float()
        model = Decoder(SHAPE, impl="opcore", dtype=dtype).eval()
        seen = _GraphSeen()
        be = oc.backend(
            _triton_first(),
            mode="inductor",
            fusion=True,
            inductor_config={"post_grad_custom_post_pass": seen.pass_},
        )
        compiled = torch.compile(model, backend=be)
        before = hidden.clone()
        with torch.inference_mode():
            outs = [compiled(positions, hidden).float() for _ in range(3)]
        rec = be.last_record
        assert rec.fusions == {"fuse_split_qkv_rmsnorm_rope": 2, "fuse_add_rms_norm": 4}, rec
        assert set(rec.by_op()["fused_add_rms_norm"]) == {"triton"}, rec
        assert torch.equal(hidden, before), "the compiled decoder wrote its input"
        tol = _tolerance(dtype, ref)
        for i, out in enumerate(outs):
            diff = float((out - ref).abs().max())
            assert diff <= tol, f"call {i}: max abs diff {diff} vs eager native > {tol}"
        # The graph Inductor gets is functional: in-place kernels only as auto_functionalized.
        assert seen.mutating == [], seen.mutating

    def test_inplace_provider_form_follows_liveness():
        # Layer 1's residual add reads the graph input: the out-of-place kernel runs there.
        # Every later residual is made in the graph and dead after its add: in place.
        positions, hidden = _inputs(torch.float32)
        model = Decoder(SHAPE, impl="opcore").eval()
        be = oc.backend(_triton_first(), mode="inductor", fusion=True)
        with torch.inference_mode():
            torch.compile(model, backend=be)(positions, hidden)
        fused = [d for d in be.last_record.lowered if d.op == "fused_add_rms_norm"]
        assert len(fused) == 4 and all(d.how == "opaque" for d in fused)
        out_of_place = [d for d in fused if not d.inplace]
        assert len(out_of_place) == 1, be.last_record
        assert (
            "graph input" in out_of_place[0].form and "out-of-place kernel" in out_of_place[0].form
        )

    @pytest.mark.parametrize("mode", ["eager", "inductor"])
    def test_dynamic_batch_with_triton_first_compiles_once(mode):
        # Symbolic token counts reach the provider's supports_args as SymInts; it must
        # still answer a plain bool (this failed on the H200 before: SymBool True).
        from opcore.compile.testing import no_recompile_on_dynamic_batch

        model = Decoder(SHAPE, impl="opcore").eval()
        result = no_recompile_on_dynamic_batch(
            (3, 5), mode=mode, model=model, config=_triton_first()
        )
        assert result["graphs"] == 1, result

    def test_fused_decoder_in_eager_mode_matches_eager():
        positions, hidden = _inputs(torch.float32)
        with torch.inference_mode():
            ref = Decoder(SHAPE, impl="native").eval()(positions, hidden)
        be = oc.backend(_triton_first(), mode="eager", fusion=True)
        compiled = torch.compile(Decoder(SHAPE, impl="opcore").eval(), backend=be)
        before = hidden.clone()
        with torch.inference_mode():
            for _ in range(2):
                torch.testing.assert_close(compiled(positions, hidden), ref, atol=1e-4, rtol=1e-4)
        assert torch.equal(hidden, before)
