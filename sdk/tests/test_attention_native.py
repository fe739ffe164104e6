"""TORCH_NATIVE against an independent naive reference written from the math: one query
token, one head, one context position at a time, in float64, from per-sequence key and
value lists (no cache, no block table)."""

from __future__ import annotations

import math

import pytest
import torch

from opcore.attention import PagedAttentionMetadata, compute_slot_mapping
from opcore.attention.backends.torch_native import TorchNativeBackend


def naive(q, keys, values, query_lens, seq_lens, scale, window, cap, causal):
    out = torch.zeros_like(q, dtype=torch.float64)
    num_heads, num_kv = q.shape[1], keys[0].shape[1]
    group = num_heads // num_kv
    row = 0
    for s, (n, length) in enumerate(zip(query_lens, seq_lens, strict=True)):
        for t in range(n):
            p = length - n + t
            for h in range(num_heads):
                kvh = h // group
                scores, vis = [], []
                for j in range(length):
                    if causal and j > p:
                        continue
                    if window is not None and abs(p - j) >= window:
                        continue
                    x = (
                        sum(
                            float(q[row, h, d]) * float(keys[s][j, kvh, d])
                            for d in range(q.shape[2])
                        )
                        * scale
                    )
                    if cap is not None:
                        x = cap * math.tanh(x / cap)
                    scores.append(x)
                    vis.append(j)
                top = max(scores)
                w = [math.exp(x - top) for x in scores]
                total = sum(w)
                for d in range(q.shape[2]):
                    out[row, h, d] = (
                        sum(wi * float(values[s][j, kvh, d]) for wi, j in zip(w, vis, strict=True))
                        / total
                    )
            row += 1
    return out


@pytest.mark.parametrize(
    "query_lens, seq_lens, block_size, heads, kv_heads, window, cap, causal",
    [
        ((1, 1, 1), (1, 9, 17), 4, 4, 4, None, None, True),  # decode, MHA
        ((5, 3), (5, 11), 4, 4, 2, None, None, True),  # prefill + chunked prefill, GQA 2
        ((1, 6, 1), (13, 6, 7), 8, 4, 1, 3, None, True),  # mixed, MQA, sliding window
        ((4, 2), (4, 9), 2, 2, 1, None, 0.7, True),  # soft-cap
        ((3, 2), (3, 5), 4, 2, 2, None, None, False),  # non-causal
        ((3, 2), (3, 5), 4, 2, 2, 2, None, False),  # non-causal, symmetric window
    ],
)
def test_torch_native_matches_naive_reference(
    query_lens, seq_lens, block_size, heads, kv_heads, window, cap, causal
):
    gen = torch.Generator().manual_seed(7)
    dim = 8
    scale = 0.9 / math.sqrt(dim)
    total = sum(query_lens)
    q = torch.randn((total, heads, dim), generator=gen, dtype=torch.float64)
    keys = [torch.randn((n, kv_heads, dim), generator=gen, dtype=torch.float64) for n in seq_lens]
    values = [torch.randn((n, kv_heads, dim), generator=gen, dtype=torch.float64) for n in seq_lens]
    need = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(seq_lens), max(need)), num_blocks - 1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        table[i, :n] = perm[used : used + n]
        used += n
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)

    impl = TorchNativeBackend(
        heads, dim, kv_heads, scale, sliding_window=window, logits_soft_cap=cap, causal=causal
    )
    cache = TorchNativeBackend.allocate_kv_cache(
        num_blocks, block_size, kv_heads, dim, torch.float64, "cpu"
    )
    cache.fill_(float("nan"))
    # Write every context position, all sequences at once, through the slot mapping.
    all_starts = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int32)
    slots = compute_slot_mapping(all_starts, lens, table, block_size)
    impl.write_kv(torch.cat(keys), torch.cat(values), cache, slots)
    md = PagedAttentionMetadata.build(starts, lens, table)
    out = impl.forward(q, cache, md)
    ref = naive(q, keys, values, query_lens, seq_lens, scale, window, cap, causal)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_low_precision_inputs_are_computed_in_float32():
    gen = torch.Generator().manual_seed(3)
    impl = TorchNativeBackend(2, 16, 2, 0.25)
    cache = TorchNativeBackend.allocate_kv_cache(4, 8, 2, 16, torch.bfloat16, "cpu")
    k = torch.randn((20, 2, 16), generator=gen).to(torch.bfloat16)
    v = torch.randn((20, 2, 16), generator=gen).to(torch.bfloat16)
    table = torch.tensor([[2, 0, 3]], dtype=torch.int32)
    lens = torch.tensor([20], dtype=torch.int32)
    impl.write_kv(k, v, cache, compute_slot_mapping(torch.tensor([0, 20]), lens, table, 8))
    q = torch.randn((1, 2, 16), generator=gen).to(torch.bfloat16)
    out = impl.forward(q, cache, PagedAttentionMetadata.build(torch.tensor([0, 1]), lens, table))
    ref = naive(q.double(), [k.double()], [v.double()], (1,), (20,), 0.25, None, None, True)
    assert out.dtype == torch.bfloat16
    # Only the final rounding to bf16 separates them.
    torch.testing.assert_close(out.double(), ref, rtol=8e-3, atol=8e-3)


def test_negative_slots_are_skipped():
    impl = TorchNativeBackend(1, 4, 1, 1.0)
    cache = TorchNativeBackend.allocate_kv_cache(2, 2, 1, 4, torch.float32, "cpu").fill_(-5.0)
    k = torch.arange(12, dtype=torch.float32).view(3, 1, 4)
    impl.write_kv(k, k + 100, cache, torch.tensor([3, -1, 0]))
    flat_k = cache[0].reshape(-1, 4)
    assert torch.equal(flat_k[3], k[0, 0]) and torch.equal(flat_k[0], k[2, 0])
    assert (flat_k[1:3] == -5.0).all()  # the skipped row wrote nothing
    assert torch.equal(cache[1].reshape(-1, 4)[3], k[0, 0] + 100)
