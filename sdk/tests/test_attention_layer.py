"""The `Attention` layer: selects a backend, owns its cache, and over a prefill followed
by decode steps computes what dense causal attention over the whole sequence computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opcore.attention import AttentionSelectionError, PagedAttentionMetadata, compute_slot_mapping
from opcore.layers.attention import Attention

I32 = torch.int32


def metadata(query_lens, seq_lens, table, block_size):
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=I32)
    lens = torch.tensor(seq_lens, dtype=I32)
    return PagedAttentionMetadata.build(
        starts, lens, table, compute_slot_mapping(starts, lens, table, block_size)
    )


def dense(q, k, v, scale):
    """Causal GQA attention over whole sequences: q [L, H, D], k/v [L, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scale
    )
    return out.transpose(0, 1)


def test_prefill_then_decode_matches_dense_attention():
    torch.manual_seed(0)
    heads, kv_heads, dim, bs = 4, 2, 16, 4
    scale = dim**-0.5
    layer = Attention(heads, dim, scale, kv_heads, dtype=torch.float64, block_size=bs)
    assert layer.backend_name == "TORCH_NATIVE"  # the only candidate on this host
    layer.allocate_kv_cache(num_blocks=8, device="cpu")
    # Two sequences (lengths 7 and 3 after prefill), blocks deliberately interleaved.
    table = torch.tensor([[5, 0, 6], [2, 7, 1]], dtype=I32)
    total = (10, 6)
    q = [torch.randn(n, heads, dim, dtype=torch.float64) for n in total]
    k = [torch.randn(n, kv_heads, dim, dtype=torch.float64) for n in total]
    v = [torch.randn(n, kv_heads, dim, dtype=torch.float64) for n in total]
    prompt = (7, 3)
    outs = [[], []]
    # Prefill both prompts in one batch (flattened [tokens, heads * dim] inputs).
    md = metadata(prompt, prompt, table, bs)
    out = layer(
        torch.cat([q[0][:7], q[1][:3]]).flatten(1),
        torch.cat([k[0][:7], k[1][:3]]).flatten(1),
        torch.cat([v[0][:7], v[1][:3]]).flatten(1),
        md,
    )
    assert out.shape == (10, heads * dim)
    outs[0].append(out[:7].view(7, heads, dim))
    outs[1].append(out[7:].view(3, heads, dim))
    # Then one token at a time, each step a decode batch; the second sequence stops early
    # and sends a chunk of two tokens in its last step (a mixed batch).
    steps = [((1, 1), (8, 4)), ((1, 2), (9, 6)), ((1, 0), (10, 6))]
    for qlens, lens in steps:
        md = metadata(qlens, lens, table, bs)
        sl = [slice(lens[i] - qlens[i], lens[i]) for i in range(2)]
        out = layer(
            torch.cat([q[i][sl[i]] for i in range(2)]),
            torch.cat([k[i][sl[i]] for i in range(2)]),
            torch.cat([v[i][sl[i]] for i in range(2)]),
            md,
        )
        outs[0].append(out[: qlens[0]])
        outs[1].append(out[qlens[0] :])
    for i in range(2):
        torch.testing.assert_close(
            torch.cat(outs[i]), dense(q[i], k[i], v[i], scale), rtol=1e-10, atol=1e-10
        )


def test_an_explicit_backend_that_cannot_serve_the_layer_fails_with_reasons():
    with pytest.raises(
        AttentionSelectionError, match=r"TRITON_PAGED .* device type 'cpu' not supported"
    ):
        Attention(8, 64, 0.125, 2, dtype=torch.float16, backend="TRITON_PAGED")


def test_cache_ownership_errors():
    layer = Attention(2, 8, 0.3, dtype=torch.float32, block_size=4)
    md = metadata((1,), (1,), torch.tensor([[0]], dtype=I32), 4)
    x = torch.randn(1, 2, 8)
    with pytest.raises(
        RuntimeError, match="no kv cache; call allocate_kv_cache or bind_kv_cache first"
    ):
        layer(x, x, x, md)
    with pytest.raises(ValueError, match=r"kv_cache must have shape \(2, 3, 4, 2, 8\)"):
        layer.bind_kv_cache(torch.zeros(2, 3, 4, 1, 8), num_blocks=3)
    layer.bind_kv_cache(torch.zeros(2, 3, 4, 2, 8), num_blocks=3)
    with pytest.raises(ValueError, match=r"key of shape \(1, 8\) is not \[num_tokens, 2 \* 8\]"):
        layer(x, torch.randn(1, 8), torch.randn(1, 16), md)
    no_slots = PagedAttentionMetadata.build(
        torch.tensor([0, 1], dtype=I32),
        torch.tensor([1], dtype=I32),
        torch.tensor([[0]], dtype=I32),
    )
    with pytest.raises(ValueError, match="metadata.slot_mapping is required"):
        layer(x, x, x, no_slots)
    assert layer(x, None, None, no_slots).shape == x.shape


def test_decode_benchmark_records_on_the_host():
    """The benchmark's record builder (no timing asserted: performance lives in bench/)."""
    from opcore.attention.bench import decode_attention_records

    (rec,) = decode_attention_records(
        (2,),
        (40,),
        backend="TORCH_NATIVE",
        device="cpu",
        dtype=torch.float32,
        heads=4,
        kv_heads=2,
        head_size=16,
    )
    assert "error" not in rec, rec
    assert rec["kv_bytes"] == 2 * 2 * 40 * 2 * 16 * 4
    assert rec["max_abs_err_vs_sdpa"] < 1e-5  # the paged result is the dense SDPA result
    assert rec["us"] > 0 and rec["sdpa_dense_us"] > 0 and rec["sdpa_gather_us"] > 0
