"""The Triton mixture-of-experts kernels (`opcore.kernels.triton.moe`) under Triton's CPU
interpreter, against the native ops.

Routing: the ids equal native's exactly (distinct logits and heavily tied ones: the lower id
wins), the weights within float32 rounding. ``fused_experts``: within the op's error budget
(peak ULPs against a float64 reference, as the conformance suite and the tuner's gate
measure) on 1, 7 and 33 tokens, 8 experts of which some are never routed to, top-1 (with
the weight on the input) and top-2, hidden 64/96 and intermediate 32/48, in fp32, fp16 and
bf16; the block-aligned sort's layout; the provider chosen by dispatch on the ops' samples;
the launches recorded and replayed by the per-call path.
As in test_triton_kernels.py, the collected test re-runs this file in a child pytest with
``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from opcore.testing.interpreter import UNDER_TRITON_INTERPRETER, rerun_under_triton_interpreter

# Builds every kernel as a GPU would (sm_90 cubin, gfx942 code object; no GPU needed): the
# bf16 GEMMs with tensor-core products and the fp32 ones with IEEE products, in a child.
_AOT = r"""
import torch
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from opcore.kernels.triton import moe
I = "i32"
targets = []
if "nvidia" in backends:
    targets.append(GPUTarget("cuda", 90, 32))
if "amd" in backends:
    targets.append(GPUTarget("hip", "gfx942", 64))
built = 0
for target in targets:
    variants = [
        (moe._route_kernel, dict(logits_ptr="*bf16", s_row=I, s_col=I, w_ptr="*fp32",
            ids_ptr="*i32", n_rows=I, n_experts=I, per_group=I, scale="fp32"),
         dict(N_GROUPS=8, TOPK=8, K_PAD=8, TOPK_GROUP=4, GROUPED=True, SIGMOID=True, RENORM=True,
              ROWS=16, BLOCK_E=256, BLOCK_G=8)),
        (moe._count_kernel, dict(ids_ptr="*i32", s_tok=I, s_slot=I, counts_ptr="*i32", n_pairs=I),
         dict(TOPK=8, CHUNK=128, BLOCK_E=128)),
        (moe._scan_kernel, dict(counts_ptr="*i32", offsets_ptr="*i32", meta_ptr="*i32", n_chunks=I,
            max_blocks=I), dict(BLOCK_M=64, BLOCK_E=128, CB=64, BB=64)),
        (moe._scatter_kernel, dict(ids_ptr="*i64", s_tok=I, s_slot=I, offsets_ptr="*i32",
            sorted_ptr="*i32", n_pairs=I, n_experts=I), dict(TOPK=2, CHUNK=128, BLOCK_E=128)),
        (moe._sum_slots_kernel, dict(y_ptr="*fp32", out_ptr="*bf16", n_tokens=I, hidden=I),
         dict(TOPK=8, ROWS=4, BLOCK_C=1024)),
    ]
    for dt, ieee in (("bf16", False), ("fp32", True)):
        gu = dict(x_ptr=f"*{dt}", sx_t=I, sx_h=I, w_ptr=f"*{dt}", sw_e=I, sw_n=I, sw_k=I,
                  tw_ptr="*fp32", stw_t=I, stw_j=I, sorted_ptr="*i32", meta_ptr="*i32",
                  inter_ptr="*fp32", max_blocks=I)
        dn = dict(inter_ptr="*fp32", w_ptr=f"*{dt}", sw_e=I, sw_n=I, sw_k=I, tw_ptr="*fp32",
                  stw_t=I, stw_j=I, sorted_ptr="*i32", meta_ptr="*i32", y_ptr="*fp32", max_blocks=I)
        # every tile moe_params picks: decode (16- and 32-row blocks), 64 and 128 rows
        for n_pairs in (64, 8 * 256, 100 * 128, 4096 * 8):
            p = moe.moe_params(n_pairs, 128, ieee)
            c = dict(hidden=2048, n_inter=768, TOPK=8, IEEE=ieee, UPCAST=False,
                     BLOCK_M=p["BLOCK_M"], GROUP=8)
            variants.append((moe._gate_up_kernel, gu, dict(c, ACT=0, WEIGHT_IN=True),
                             p["gate_up"]))
            variants.append((moe._down_kernel, dn, dict(c, WEIGHT_OUT=True), p["down"]))
    for kernel, sig, consts, *launch in variants:
        opts = None
        if launch:  # a GEMM: its tiles are constexprs, warps and stages compile options
            opts = {k: launch[0][k] for k in ("num_warps", "num_stages")}
            consts = dict(consts, BLOCK_N=launch[0]["BLOCK_N"], BLOCK_K=launch[0]["BLOCK_K"])
        full = {**sig, **{k: "constexpr" for k in consts}}
        src = ASTSource(fn=kernel, signature=full, constexprs=consts)
        out = compile(src, target=target, options=opts)
        assert {"cubin", "hsaco"} & set(out.asm), sorted(out.asm)
        built += 1
print("compiled", built)
"""

if not UNDER_TRITON_INTERPRETER:

    def test_triton_moe_kernels_under_interpreter():
        rerun_under_triton_interpreter(__file__)

    def test_moe_kernels_compile_for_hopper_and_mi300_without_a_gpu():
        pytest.importorskip("triton")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        proc = subprocess.run(
            [sys.executable, "-c", _AOT], capture_output=True, text=True, timeout=600, env=env
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert proc.stdout.strip().startswith("compiled "), proc.stdout

else:
    pytest.importorskip("triton")
    from opcore.ir import ops
    from opcore.kernels.triton import _bound, _register, moe
    from opcore.tuner.gate import budget, peak_ulp

    DTYPES = [torch.float32, torch.float16, torch.bfloat16]

    def _logits(t, e, dtype, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(t, e, generator=g).to(dtype)

    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("tokens", [1, 7, 33])
    @pytest.mark.parametrize("experts,topk", [(8, 1), (8, 2), (60, 8)])
    def test_topk_softmax_ids_exact(dtype, tokens, experts, topk):
        x = _logits(tokens, experts, dtype, tokens * 100 + experts)
        for renorm in (True, False):
            w, ids = moe.topk_softmax(x, topk, renorm)
            nw, nids = ops.topk_softmax.native(x, topk, renorm)
            assert ids.dtype == torch.int32 and w.dtype == torch.float32
            assert torch.equal(ids, nids)
            torch.testing.assert_close(w, nw, atol=1e-6, rtol=1e-5)

    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    def test_topk_softmax_ties_go_to_the_lower_id(dtype):
        x = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0, 2.0]], dtype=dtype)
        w, ids = moe.topk_softmax(x, 4, False)
        assert ids.tolist() == [[1, 2, 4, 0], [0, 1, 2, 3]]
        assert torch.equal(w[1], torch.full((4,), 0.2))
        # mostly tied rows, and -inf logits (chosen last, lowest id first)
        g = torch.Generator().manual_seed(3)
        x = torch.randint(-1, 2, (33, 16), generator=g).to(dtype)
        x[0, :] = float("-inf")
        x[1, 3] = 1.0
        for k in (1, 2, 8, 16):
            assert torch.equal(
                moe.topk_softmax(x, k, True)[1], ops.topk_softmax.native(x, k, True)[1]
            )

    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
    def test_grouped_topk_matches_native(dtype, scoring):
        for t, e, groups, tg, k, renorm, scale, tied in [
            (7, 64, 8, 3, 6, False, 1.0, False),
            (33, 32, 4, 2, 4, True, 2.5, True),
            (1, 8, 1, 1, 2, True, 1.0, False),
        ]:
            x = _logits(t, e, dtype, e)
            if tied:
                x = x.round().clamp(-1, 1)
            args = (x, k, renorm, groups, tg, scoring, scale)
            w, ids = moe.grouped_topk(*args)
            nw, nids = ops.grouped_topk.native(*args)
            assert torch.equal(ids, nids), (t, e)
            torch.testing.assert_close(w, nw, atol=1e-6 * scale, rtol=1e-5)
        bias = torch.zeros(64)
        assert not _register.supports_grouped_topk(x, 4, True, 4, 2, scoring, 1.0, bias)

    @pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
    def test_grouped_topk_never_picks_an_expert_of_a_dropped_group(scoring):
        # The kernel masked dropped experts to -inf and let them stay candidates, so a kept
        # expert at -inf tied with them and the dropped group's lower id won ([2, 0] for
        # the first row); the native op (and so the ids) takes kept experts only.
        ninf = float("-inf")
        x = torch.tensor([[0.0, 0.0, 5.0, ninf], [ninf, 1.0, ninf, ninf]])
        for k, groups, tg in ((2, 2, 1), (1, 2, 1), (2, 4, 2)):
            args = (x, k, True, groups, tg, scoring, 1.0)
            ids = moe.grouped_topk(*args)[1]
            assert torch.equal(ids, ops.grouped_topk.native(*args)[1]), (k, groups, tg, ids)
        assert moe.grouped_topk(x, 2, True, 2, 1, scoring, 1.0)[1].tolist() == [[2, 3], [1, 0]]

    def _experts_case(tokens, e, used, k, h, i, dtype, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(tokens, h, generator=g).to(dtype)
        w13 = (torch.randn(e, 2 * i, h, generator=g) * h**-0.5).to(dtype)
        w2 = (torch.randn(e, h, i, generator=g) * i**-0.5).to(dtype)
        pool = torch.randperm(e, generator=g)[:used]
        ids = pool[torch.rand(tokens, used, generator=g).argsort(dim=-1)[:, :k]].to(torch.int32)
        weights = torch.softmax(torch.randn(tokens, k, generator=g), dim=-1)
        return x, w13, w2, weights, ids

    def _within_budget(got, args, dtype, where):
        ref = ops.fused_experts.native(
            *(a.double() if a.is_floating_point() else a for a in args[:5]), *args[5:]
        )
        factor, floor = budget(ops.fused_experts, dtype)
        native_peak = peak_ulp(ops.fused_experts.native(*args), ref, dtype)
        peak = peak_ulp(got, ref, dtype)
        assert peak <= max(factor * native_peak, floor), (where, peak, native_peak)
        return peak

    # (experts, used, topk, hidden, intermediate, activation, weight on input)
    EXPERT_CASES = [
        (8, 5, 1, 64, 32, "silu", True),
        (8, 6, 2, 96, 48, "silu", False),
        (8, 8, 2, 64, 48, "gelu", False),
    ]

    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("tokens", [1, 7, 33])
    @pytest.mark.parametrize("case", EXPERT_CASES, ids=lambda c: f"e{c[0]}u{c[1]}k{c[2]}_{c[5]}")
    def test_fused_experts_within_the_error_budget(dtype, tokens, case):
        e, used, k, h, i, act, on_input = case
        x, w13, w2, w, ids = _experts_case(tokens, e, used, k, h, i, dtype, tokens + h)
        args = (x, w13, w2, w, ids, act, on_input)
        got = moe.fused_experts(*args)
        assert got.shape == x.shape and got.dtype == dtype
        _within_budget(got, args, dtype, case)
        if dtype == torch.float32:  # fp32 end to end: only the order of the sums differs
            torch.testing.assert_close(got, ops.fused_experts.native(*args), atol=2e-6, rtol=1e-5)

    def test_fused_experts_top8_int64_ids_and_strided_inputs():
        x, w13, w2, w, ids = _experts_case(9, 16, 12, 8, 40, 24, torch.bfloat16, 1)
        wide = torch.zeros(9, 120, dtype=torch.bfloat16)
        wide[:, 40:80] = x
        args = (wide[:, 40:80], w13, w2, w.t().contiguous().t(), ids.long(), "silu", False)
        _within_budget(moe.fused_experts(*args), args, torch.bfloat16, "top-8")

    def test_unused_experts_are_never_read():
        x, w13, w2, w, ids = _experts_case(7, 8, 3, 2, 64, 32, torch.float16, 2)
        out = moe.fused_experts(x, w13, w2, w, ids)
        unused = torch.ones(8, dtype=torch.bool)
        unused[ids.unique().long()] = False
        w13b, w2b = w13.clone(), w2.clone()
        w13b[unused] = float("nan")
        w2b[unused] = float("nan")
        assert torch.equal(moe.fused_experts(x, w13b, w2b, w, ids), out)

    @pytest.mark.parametrize("block_m", [16, 32])
    def test_align_block_size_layout(block_m):
        g = torch.Generator().manual_seed(4)
        experts, k = 8, 2
        ids = torch.randint(0, 6, (33, k), generator=g, dtype=torch.int32)  # 6, 7 unused
        ids[:, 1] = (ids[:, 0] + 1) % 6
        pairs, meta = moe.align_block_size(ids, experts, block_m)
        max_blocks = meta.shape[1]
        assert max_blocks == 33 * k // block_m + experts
        flat = ids.reshape(-1)
        counts = torch.bincount(flat.long(), minlength=experts)
        blocks = (counts + block_m - 1) // block_m
        n_blocks = int(blocks.sum())
        want_expert = torch.repeat_interleave(torch.arange(experts), blocks)
        assert meta[0, :n_blocks].tolist() == want_expert.tolist()
        assert (meta[0, n_blocks:] == -1).all() and (meta[1, n_blocks:] == 0).all()
        start = 0
        for e in range(experts):
            rows = pairs[start * block_m : start * block_m + int(counts[e])]
            # the pairs of expert e in increasing order (a stable sort), then the padding
            assert rows.tolist() == torch.nonzero(flat == e).flatten().tolist()
            real = meta[1, start : start + int(blocks[e])]
            assert int(real.sum()) == int(counts[e]) and (real <= block_m).all()
            start += int(blocks[e])

    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("op_name", ["topk_softmax", "grouped_topk", "fused_experts"])
    def test_dispatch_picks_triton_on_the_samples(op_name, dtype):
        op = getattr(ops, op_name)
        ran = 0
        for s in op.sample_inputs("cpu", dtype):
            if not op.impls["triton"].supports_args(*s.args, **s.kwargs):
                # only grouped_topk with a score-correction bias is declined
                assert op_name == "grouped_topk" and s.args[-1] is not None, s.name
                continue
            with op.set_priority(["triton", "native"]):
                assert op.dispatch(*s.args, **s.kwargs).provider == "triton"
                got = op(*s.args, **s.kwargs)
            want = op.native(*s.args, **s.kwargs)
            if op_name == "fused_experts":
                _within_budget(got, s.args, dtype, s.name)
            else:
                assert torch.equal(got[1], want[1]), s.name
                torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
            ran += 1
        assert ran

    def test_fused_experts_binds_and_replays():
        for k, on_input in ((2, False), (1, True)):
            x, w13, w2, w, ids = _experts_case(7, 8, 6, k, 64, 32, torch.bfloat16, 5)
            args = (x, w13, w2, w, ids, "silu", on_input)
            first, replay = _bound.binder(moe.fused_experts)(*args)
            assert replay is not None, "the provider's launches could not be recorded"
            x2, w13b, w2b, wb, ids2 = _experts_case(7, 8, 6, k, 64, 32, torch.bfloat16, 6)
            again = replay(x2, w13b, w2b, wb, ids2, "silu", on_input)
            assert torch.equal(again, moe.fused_experts(x2, w13b, w2b, wb, ids2, "silu", on_input))
            assert torch.equal(replay(*args), first)
        logits = _logits(5, 16, torch.float16, 0)
        first, replay = _bound.binder(moe.topk_softmax)(logits, 4, True)
        assert replay is not None and torch.equal(replay(logits, 4, True)[1], first[1])
