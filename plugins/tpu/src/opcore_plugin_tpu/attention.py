"""Attention backend ``PALLAS``: torch_xla's ragged paged attention (a Pallas TPU kernel).

Cache layout (torch_xla's): ``[num_blocks, block_size, 2 * num_kv_heads, head_size]`` with
key and value heads interleaved (``k0, v0, k1, v1, ...``), so one page holds both.
`forward` maps `PagedAttentionMetadata` onto the kernel's arguments: ``cu_q_lens`` =
``query_start_loc``, ``kv_lens`` = ``seq_lens``, ``page_indices`` = ``block_table``.

On a TPU the kernel runs (``use_kernel=True``). Anywhere else the backend is unavailable
to the selector; ``plugins/tpu/scripts/check_pallas.py`` runs the same plumbing with
torch_xla's non-kernel reference path (``use_kernel=False``) on XLA:CPU against
``TORCH_NATIVE`` so the layout and metadata mapping are checked without a TPU.
"""

from __future__ import annotations

import torch

from opcore.attention import AttentionBackend, MultipleOf, PagedAttentionMetadata
from opcore.attention.paged import check_qkv

LANE = 128  # TPU vector lane width: the kernel tiles head_size by it


class PallasBackend(AttentionBackend):
    name = "PALLAS"
    supported_dtypes = (torch.bfloat16, torch.float32)
    supported_kv_cache_dtypes = ("auto",)
    supported_block_sizes = (MultipleOf(16),)
    supported_device_types = ("xla",)
    supports_gqa = True
    supports_mqa = True
    supports_sliding_window = True
    supports_causal = True
    supports_non_causal = False
    supports_logits_soft_cap = True
    # Class-level so a check script can run the plumbing without the TPU kernel.
    use_kernel: bool | None = None  # None: the kernel exactly when on a real TPU

    @classmethod
    def unavailable_reason(cls, device_type: str | None) -> str | None:
        from opcore_plugin_tpu.platform import on_real_tpu

        if not on_real_tpu():
            return "needs a TPU (torch_xla PJRT device TPU): the Pallas kernel is a TPU custom call"
        import importlib.util

        if importlib.util.find_spec("jax") is None:
            return "needs JAX to build the Pallas kernel (pip install 'opcore-plugin-tpu[tpu]')"
        return None

    @classmethod
    def supports_combination(cls, cfg) -> str | None:
        if cfg.head_size % LANE:
            return f"head_size {cfg.head_size} is not a multiple of the TPU lane width {LANE}"
        return None

    @classmethod
    def get_kv_cache_shape(cls, num_blocks, block_size, num_kv_heads, head_size):
        return (num_blocks, block_size, 2 * num_kv_heads, head_size)

    def split_kv_cache(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        expected = (2 * self.num_kv_heads, self.head_size)
        if kv_cache.dim() != 4 or tuple(kv_cache.shape[2:]) != expected:
            raise ValueError(
                f"{self.name}: kv_cache must have shape (num_blocks, block_size, "
                f"{expected[0]}, {expected[1]}) (k/v heads interleaved), "
                f"got {tuple(kv_cache.shape)}"
            )
        return kv_cache[:, :, 0::2], kv_cache[:, :, 1::2]

    def write_kv(self, key, value, kv_cache, slot_mapping) -> None:
        check_qkv(
            self.name, self.num_heads, self.num_kv_heads, self.head_size, key=key, value=value
        )
        self.split_kv_cache(kv_cache)
        if slot_mapping.dim() != 1 or slot_mapping.numel() != key.shape[0]:
            raise ValueError(
                f"{self.name}: slot_mapping must be 1-D with one slot per key row "
                f"({key.shape[0]}), got shape {tuple(slot_mapping.shape)}"
            )
        num_slots = kv_cache.shape[0] * kv_cache.shape[1]
        flat = kv_cache.view(num_slots, 2 * self.num_kv_heads, self.head_size)
        rows = torch.stack((key, value), dim=2).reshape(
            key.shape[0], 2 * self.num_kv_heads, self.head_size
        )
        slots = slot_mapping.to(torch.int64)
        if kv_cache.device.type == "xla":
            # No data-dependent shapes in the lazy graph: padding rows (slot -1) are sent
            # out of bounds, and XLA's scatter drops out-of-bounds updates.
            slots = torch.where(slots < 0, torch.full_like(slots, num_slots), slots)
            flat.index_copy_(0, slots, rows.to(flat.dtype))
        else:
            keep = slots >= 0
            flat.index_copy_(0, slots[keep], rows[keep].to(flat.dtype))

    def forward(self, query, kv_cache, metadata: PagedAttentionMetadata) -> torch.Tensor:
        from torch_xla.experimental.custom_kernel import ragged_paged_attention

        check_qkv(self.name, self.num_heads, self.num_kv_heads, self.head_size, query=query)
        self.split_kv_cache(kv_cache)
        use_kernel = self.use_kernel
        if use_kernel is None:
            from opcore_plugin_tpu.platform import on_real_tpu

            use_kernel = on_real_tpu()
        batch = metadata.seq_lens.shape[0]
        num_seqs = torch.tensor([batch], dtype=torch.int32, device=query.device)
        return ragged_paged_attention(
            query,
            kv_cache,
            metadata.seq_lens.to(torch.int32),
            metadata.block_table.to(torch.int32),
            metadata.query_start_loc.to(torch.int32),
            num_seqs,
            sm_scale=self.scale,
            sliding_window=self.sliding_window,
            soft_cap=self.logits_soft_cap,
            use_kernel=use_kernel,
        )
