"""Attention backend ``ASCEND``: paged attention through torch_npu's fused kernels.

Cache: opcore's default layout ``(2, num_blocks, block_size, num_kv_heads, head_size)``;
``kv_cache[0]`` / ``kv_cache[1]`` are the ND ``[num_blocks, block_size, kv_heads,
head_size]`` key and value caches that torch_npu's paged kernels take on Atlas A2/A3.

* `write_kv`: ``torch_npu._npu_reshape_and_cache(key, value, key_cache, value_cache,
  slot_indices)``. The kernel takes slots in ``[0, num_slots)`` only, so padding rows
  (negative slots) are removed first (a boolean mask: one small device sync per batch).
* `forward`, a decode-only batch (every sequence brings one token, no sliding window):
  ``torch_npu._npu_paged_attention(query, key_cache, value_cache, num_kv_heads,
  num_heads, scale_value, block_table, context_lens, out)``.
* `forward`, prefill / mixed batches: ``torch_npu.npu_fused_infer_attention_score`` with
  ``input_layout="TND"``, ``block_table``, ``block_size``, cumulative query ends in
  ``actual_seq_lengths`` and context lengths in ``actual_seq_lengths_kv``; causal masking
  is ``sparse_mode=3`` (right-down causal) with the 2048x2048 upper-triangular mask the
  kernel expects; a sliding window of ``W`` keys is ``sparse_mode=4`` (band) with
  ``pre_tokens=W - 1, next_tokens=0``.

Never run: no Ascend NPU was available. Written from torch_npu's documentation and
vllm-ascend's calls; the declarations below are conservative (torch_npu documents block
sizes 64 and 128 for its paged attention on Atlas A2/A3).
"""

from __future__ import annotations

import itertools

import torch

from opcore.attention import AttentionBackend, PagedAttentionMetadata
from opcore.attention.paged import check_qkv

MASK_SIZE = 2048  # the compressed causal/band mask size torch_npu's sparse modes 2-4 take

_masks: dict[torch.device, torch.Tensor] = {}


def causal_mask(device: torch.device) -> torch.Tensor:
    """The ``[2048, 2048]`` bool mask (True = masked: strictly above the diagonal) that
    sparse modes 3 and 4 expect; built once per device."""
    mask = _masks.get(device)
    if mask is None:
        mask = torch.triu(
            torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool, device=device), diagonal=1
        )
        _masks[device] = mask
    return mask


class AscendBackend(AttentionBackend):
    name = "ASCEND"
    supported_dtypes = (torch.float16, torch.bfloat16)
    supported_kv_cache_dtypes = ("auto",)
    supported_block_sizes = (64, 128)
    supported_device_types = ("npu",)
    supports_gqa = True
    supports_mqa = True
    supports_sliding_window = True
    supports_causal = True
    supports_non_causal = False
    supports_logits_soft_cap = False

    @classmethod
    def unavailable_reason(cls, device_type: str | None) -> str | None:
        from opcore_plugin_ascend import detect

        found = detect.probe()
        return None if isinstance(found, str) else f"no usable NPU: {found.reason}"

    def write_kv(self, key, value, kv_cache, slot_mapping) -> None:
        import torch_npu

        check_qkv(
            self.name, self.num_heads, self.num_kv_heads, self.head_size, key=key, value=value
        )
        key_cache, value_cache = self.split_kv_cache(kv_cache)
        if slot_mapping.dim() != 1 or slot_mapping.numel() != key.shape[0]:
            raise ValueError(
                f"{self.name}: slot_mapping must be 1-D with one slot per key row "
                f"({key.shape[0]}), got shape {tuple(slot_mapping.shape)}"
            )
        keep = slot_mapping >= 0
        torch_npu._npu_reshape_and_cache(
            key=key[keep].contiguous(),
            value=value[keep].contiguous(),
            key_cache=key_cache,
            value_cache=value_cache,
            slot_indices=slot_mapping[keep].to(torch.int32),
        )

    def forward(self, query, kv_cache, metadata: PagedAttentionMetadata) -> torch.Tensor:
        import torch_npu

        check_qkv(self.name, self.num_heads, self.num_kv_heads, self.head_size, query=query)
        key_cache, value_cache = self.split_kv_cache(kv_cache)
        num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
        metadata.check_cache(num_blocks, block_size)
        block_table = metadata.block_table.to(torch.int32)
        decode_only = all(n == 1 for n in metadata.query_lens_host)
        if decode_only and self.sliding_window is None:
            out = torch.empty_like(query)
            torch_npu._npu_paged_attention(
                query=query.contiguous(),
                key_cache=key_cache,
                value_cache=value_cache,
                num_kv_heads=self.num_kv_heads,
                num_heads=self.num_heads,
                scale_value=self.scale,
                block_table=block_table,
                context_lens=torch.tensor(metadata.seq_lens_host, dtype=torch.int32),
                out=out,
            )
            return out
        if self.sliding_window is None:
            window = {"sparse_mode": 3}
        else:
            window = {"sparse_mode": 4, "pre_tokens": self.sliding_window - 1, "next_tokens": 0}
        out, _lse = torch_npu.npu_fused_infer_attention_score(
            query.contiguous(),
            key_cache.view(num_blocks, block_size, -1),
            value_cache.view(num_blocks, block_size, -1),
            atten_mask=causal_mask(query.device),
            block_table=block_table,
            input_layout="TND",
            block_size=block_size,
            actual_seq_lengths=list(itertools.accumulate(metadata.query_lens_host)),
            actual_seq_lengths_kv=list(metadata.seq_lens_host),
            num_key_value_heads=self.num_kv_heads,
            num_heads=self.num_heads,
            scale=self.scale,
            **window,
        )
        return out
