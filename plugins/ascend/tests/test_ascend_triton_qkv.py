"""The Ascend plugin's NPU-tiled Triton ``split_qkv_rmsnorm_rope``, in Triton's CPU
interpreter, against a float64 reference from the op's definition (docs/design.md#op-semantics),
not from the native function.

The interpreter is chosen when the kernel is decorated, so it must be on before the kernel
module is first imported; the collected test re-runs this file in a child pytest with
``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import pytest
import torch

from opcore.testing.interpreter import UNDER_TRITON_INTERPRETER, rerun_under_triton_interpreter

INTERPRETED = UNDER_TRITON_INTERPRETER


def test_ascend_rows_per_chunk_fits_the_unified_buffer():
    pytest.importorskip("triton")
    from opcore_plugin_ascend.triton_qkv import LIVE_TILES, rows_per_chunk

    for head in (64, 80, 128, 256):
        rows = rows_per_chunk(head)
        pad = 1 << (head - 1).bit_length()
        assert rows & (rows - 1) == 0  # a power of two (a tl.arange extent)
        assert rows * pad * 4 * LIVE_TILES <= 87040
        assert 2 * rows * pad * 4 * LIVE_TILES > 87040 or rows == 64
    assert rows_per_chunk(128, ub_bytes=1) == 1


if not INTERPRETED:

    def test_ascend_triton_qkv_under_interpreter():
        rerun_under_triton_interpreter(__file__)

else:
    pytest.importorskip("triton")
    from opcore.ir import ops
    from opcore_plugin_ascend import triton_provider, triton_qkv

    TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

    def reference(qkv, qw, kw, eps, positions, cache, nh, nkv, d, is_neox):
        """float64, from the definition: split; per-head RMS over d; times the weight;
        rotate the first rot_dim dims of each head (NeoX halves or GPT-J pairs) by the
        cos/sin row of the token's position; copy v."""
        n = positions.numel()
        x = qkv.double().reshape(n, -1)
        rot = cache.shape[1]
        half = rot // 2
        c = cache.double()[positions.reshape(-1)]
        cos, sin = c[:, None, :half], c[:, None, half:]

        def part(t, heads, w):
            t = t.reshape(n, heads, d)
            t = t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps)
            if w is not None:
                t = t * w.double()
            r = t[..., :rot]
            if is_neox:
                a, b = r[..., :half], r[..., half:]
                r = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
            else:
                a, b = r[..., 0::2], r[..., 1::2]
                r = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
            return torch.cat([r, t[..., rot:]], -1).reshape(n, heads * d)

        q = part(x[:, : nh * d], nh, qw)
        k = part(x[:, nh * d : (nh + nkv) * d], nkv, kw)
        v = x[:, (nh + nkv) * d :]
        lead = qkv.shape[:-1]
        return q.reshape(*lead, -1), k.reshape(*lead, -1), v.reshape(*lead, -1)

    def make(tokens, nh, nkv, d, rot, dtype, *, weights=True, strided=False, lead=None, seed=0):
        g = torch.Generator().manual_seed(seed)
        width = (nh + 2 * nkv) * d
        if strided:  # q/k/v as a column slice of a wider buffer: rows are strided
            qkv = torch.randn(tokens, width + 24, generator=g).to(dtype)[:, 8 : 8 + width]
        else:
            qkv = torch.randn(tokens, width, generator=g).to(dtype)
        qw = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype) if weights else None
        kw = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype) if weights else None
        cache = torch.randn(97, rot, generator=g)
        pos = torch.randint(0, 97, (tokens,), generator=g)
        if lead is not None:
            qkv = qkv.reshape(*lead, width)
            pos = pos.reshape(lead)
        return qkv, qw, kw, 1e-6, pos, cache, nh, nkv, d

    def check(outs, refs, dtype):
        for out, ref in zip(outs, refs, strict=True):
            assert out.dtype == dtype and out.shape == ref.shape
            torch.testing.assert_close(out.double(), ref, atol=TOL[dtype], rtol=TOL[dtype])

    CASES = [
        # tokens, q heads, kv heads, head size, rot dim, style
        (7, 2, 1, 64, 64, True),
        (7, 2, 1, 64, 64, False),
        (13, 4, 2, 80, 32, True),  # head not a power of two, partial rotary
        (13, 4, 2, 80, 48, False),  # partial GPT-J
        (1, 1, 1, 32, 32, True),  # one token
    ]

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
    @pytest.mark.parametrize(
        "case",
        CASES,
        ids=lambda c: f"t{c[0]}_h{c[1]}_kv{c[2]}_d{c[3]}_r{c[4]}_{'neox' if c[5] else 'gptj'}",
    )
    def test_ascend_triton_qkv_matches_definition(case, dtype):
        tokens, nh, nkv, d, rot, neox = case
        args = make(tokens, nh, nkv, d, rot, dtype)
        outs = triton_qkv.split_qkv_rmsnorm_rope_tiled(*args, neox, num_programs=3)
        check(outs, reference(*args, neox), dtype)

    def test_ascend_triton_qkv_chunks_programs_and_layouts():
        # A tiny unified buffer forces several chunks per program, more programs than
        # fit the tokens are clamped, rows may be strided, 3-D qkv with 2-D positions,
        # and weights may be absent.
        for kwargs, layout in [
            ({"num_programs": 2, "ub_bytes": 4 * 5 * 4 * 64}, {}),
            ({"num_programs": 64}, {}),
            ({"num_programs": 3}, {"strided": True}),
            ({"num_programs": 2}, {"lead": (3, 3)}),
            ({"num_programs": 2}, {"weights": False}),
        ]:
            args = make(9, 3, 1, 64, 64, torch.float32, **layout, seed=7)
            outs = triton_qkv.split_qkv_rmsnorm_rope_tiled(*args, True, **kwargs)
            check(outs, reference(*args, True), torch.float32)

    def test_ascend_triton_qkv_is_dispatched_as_provider_and_mutates_nothing():
        args = make(5, 2, 1, 64, 64, torch.bfloat16, strided=True, seed=3)
        before = args[0].clone()
        assert triton_provider.INTERPRETED and triton_provider.DEVICE_TYPES == {"cpu"}
        op = ops.split_qkv_rmsnorm_rope
        with op.set_priority(["ascend_triton", "native"]):
            assert op.dispatch(*args, True).provider == "ascend_triton"
            outs = op(*args, True)
        check(outs, reference(*args, True), torch.bfloat16)
        assert torch.equal(args[0], before)

    def test_ascend_triton_qkv_declines_non_contiguous_last_dim():
        qkv, *rest = make(4, 2, 1, 64, 64, torch.float32)
        transposed = qkv.t().contiguous().t()  # same values, column-major
        assert triton_provider.supports_split_qkv_rmsnorm_rope(qkv, *rest, True) is True
        assert triton_provider.supports_split_qkv_rmsnorm_rope(transposed, *rest, True) is False
