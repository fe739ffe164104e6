"""``TORCH_NATIVE``: paged attention in plain torch, on any device.

The reference every other backend is checked against. Per sequence it gathers the
context's keys and values through the block table and computes the attention exactly as
the contract states, in float32 (float64 when the inputs are float64). It is written
for clarity, not speed: one gather and two matmuls per sequence.
"""

from __future__ import annotations

import torch

from opcore.attention.backend import AttentionBackend, MultipleOf
from opcore.attention.paged import PagedAttentionMetadata, check_qkv


class TorchNativeBackend(AttentionBackend):
    name = "TORCH_NATIVE"
    supported_dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    supported_kv_cache_dtypes = ("auto",)
    supported_head_sizes = ()
    supported_block_sizes = (MultipleOf(1),)
    supported_device_types = ()
    supports_gqa = True
    supports_mqa = True
    supports_sliding_window = True
    supports_causal = True
    supports_non_causal = True
    supports_logits_soft_cap = True
    # docs/properties.md: each sequence is computed by itself, in a fixed order.
    properties = frozenset({"batch_invariant", "deterministic"})

    def write_kv(self, key, value, kv_cache, slot_mapping) -> None:
        key_cache, value_cache = self.check_write_kv(key, value, kv_cache, slot_mapping)
        keep = slot_mapping >= 0
        slots = slot_mapping[keep].to(torch.int64)
        flat_k = key_cache.view(-1, self.num_kv_heads, self.head_size)
        flat_v = value_cache.view(-1, self.num_kv_heads, self.head_size)
        flat_k.index_copy_(0, slots, key[keep])
        flat_v.index_copy_(0, slots, value[keep])

    def forward(self, query, kv_cache, metadata: PagedAttentionMetadata) -> torch.Tensor:
        check_qkv(self.name, self.num_heads, self.num_kv_heads, self.head_size, query=query)
        if query.shape[0] != metadata.num_tokens:
            raise ValueError(
                f"{self.name}: query has {query.shape[0]} tokens but query_start_loc[-1] is "
                f"{metadata.num_tokens}"
            )
        key_cache, value_cache = self.split_kv_cache(kv_cache)
        num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
        metadata.check_cache(num_blocks, block_size)
        compute = torch.float64 if query.dtype == torch.float64 else torch.float32
        group = self.num_heads // self.num_kv_heads
        out = torch.empty_like(query)
        starts = [0]
        for n in metadata.query_lens_host:
            starts.append(starts[-1] + n)
        table = metadata.block_table.to(torch.int64)
        for i, (n, length) in enumerate(
            zip(metadata.query_lens_host, metadata.seq_lens_host, strict=False)
        ):
            if n == 0:
                continue
            blocks = table[i, : -(-length // block_size)]
            k = (
                key_cache[blocks]
                .reshape(-1, self.num_kv_heads, self.head_size)[:length]
                .to(compute)
            )
            v = (
                value_cache[blocks]
                .reshape(-1, self.num_kv_heads, self.head_size)[:length]
                .to(compute)
            )
            q = (
                query[starts[i] : starts[i + 1]]
                .to(compute)
                .view(n, self.num_kv_heads, group, self.head_size)
            )
            # scores[h, g, t, j]: query token t (head h*group+g) against context position j.
            scores = torch.einsum("thgd,jhd->hgtj", q, k) * self.scale
            if self.logits_soft_cap is not None:
                scores = self.logits_soft_cap * torch.tanh(scores / self.logits_soft_cap)
            q_pos = torch.arange(length - n, length, device=query.device)[:, None]
            k_pos = torch.arange(length, device=query.device)[None, :]
            visible = k_pos <= q_pos if self.causal else torch.ones_like(k_pos <= q_pos)
            if self.sliding_window is not None:
                visible = visible & ((q_pos - k_pos).abs() < self.sliding_window)
            scores = scores.masked_fill(~visible, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            o = torch.einsum("hgtj,jhd->thgd", probs, v)
            out[starts[i] : starts[i + 1]] = o.reshape(n, self.num_heads, self.head_size).to(
                out.dtype
            )
        return out
