"""Attention backend ``VDEV``: paged attention as the virtual device computes it.

Cache: opcore's default layout ``(2, num_blocks, block_size, num_kv_heads, head_size)``.

* `write_kv`: the rows with a slot (negative slots are padding) scattered into the flat
  ``[num_slots, num_kv_heads, head_size]`` views of the key and value caches.
* `forward`: per sequence, the context's slot indices are computed from its block table
  (``block * block_size + offset``), its keys and values gathered with one
  ``index_select`` each, and the new tokens' attention computed in float32 with batched
  matmuls over the query heads (grouped-query heads read their key/value head by
  ``repeat_interleave``), causal and sliding-window masks and the logits soft cap applied
  to the scores.

Everything runs in torch ops on the ``vdev`` tensors, so through the virtual device's aten
kernels; it is checked against ``TORCH_NATIVE`` by the conformance suite like any
backend.
"""

from __future__ import annotations

import torch

from opcore.attention import AttentionBackend, MultipleOf, PagedAttentionMetadata
from opcore.attention.paged import check_qkv
from opcore_plugin_vdev import DEVICE_TYPE


class VdevBackend(AttentionBackend):
    name = "VDEV"
    supported_dtypes = (torch.float32, torch.float16, torch.bfloat16)
    supported_kv_cache_dtypes = ("auto",)
    supported_block_sizes = (MultipleOf(1),)
    supported_device_types = (DEVICE_TYPE,)
    supports_gqa = True
    supports_mqa = True
    supports_sliding_window = True
    supports_causal = True
    supports_non_causal = True
    supports_logits_soft_cap = True

    @classmethod
    def unavailable_reason(cls, device_type: str | None) -> str | None:
        from opcore import vdev

        installed = vdev.installed()
        if installed is None or installed.device_type != DEVICE_TYPE:
            return (
                f"the virtual device is not installed as {DEVICE_TYPE!r} "
                "(OPCORE_VDEV=1 installs it)"
            )
        return None

    def write_kv(self, key, value, kv_cache, slot_mapping) -> None:
        key_cache, value_cache = self.check_write_kv(key, value, kv_cache, slot_mapping)
        keep = slot_mapping >= 0
        slots = slot_mapping[keep].to(torch.int64)
        key_cache.view(-1, self.num_kv_heads, self.head_size).index_copy_(0, slots, key[keep])
        value_cache.view(-1, self.num_kv_heads, self.head_size).index_copy_(0, slots, value[keep])

    def forward(self, query, kv_cache, metadata: PagedAttentionMetadata) -> torch.Tensor:
        check_qkv(self.name, self.num_heads, self.num_kv_heads, self.head_size, query=query)
        key_cache, value_cache = self.split_kv_cache(kv_cache)
        num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
        metadata.check_cache(num_blocks, block_size)
        flat_k = key_cache.reshape(-1, self.num_kv_heads, self.head_size)
        flat_v = value_cache.reshape(-1, self.num_kv_heads, self.head_size)
        group = self.num_heads // self.num_kv_heads
        table = metadata.block_table.to(torch.int64)
        out = torch.empty_like(query)
        start = 0
        for i, (n, length) in enumerate(
            zip(metadata.query_lens_host, metadata.seq_lens_host, strict=False)
        ):
            if n == 0:
                continue
            pos = torch.arange(length, device=query.device)
            slots = table[i].index_select(0, pos // block_size) * block_size + pos % block_size
            # [heads, length, head_size]: each query head reads its key/value head
            k = (
                flat_k.index_select(0, slots)
                .float()
                .transpose(0, 1)
                .repeat_interleave(group, dim=0)
            )
            v = (
                flat_v.index_select(0, slots)
                .float()
                .transpose(0, 1)
                .repeat_interleave(group, dim=0)
            )
            q = query[start : start + n].float().transpose(0, 1)  # [heads, n, head_size]
            scores = torch.bmm(q, k.transpose(1, 2)) * self.scale  # [heads, n, length]
            if self.logits_soft_cap is not None:
                scores = torch.tanh(scores / self.logits_soft_cap) * self.logits_soft_cap
            q_pos = torch.arange(length - n, length, device=query.device).unsqueeze(1)
            visible = torch.ones(n, length, dtype=torch.bool, device=query.device)
            if self.causal:
                visible = visible & (pos.unsqueeze(0) <= q_pos)
            if self.sliding_window is not None:
                visible = visible & ((q_pos - pos.unsqueeze(0)).abs() < self.sliding_window)
            scores = scores.masked_fill(~visible, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            o = torch.bmm(probs, v).transpose(0, 1)  # [n, heads, head_size]
            out[start : start + n] = o.to(out.dtype)
            start += n
        return out
