"""`RotaryEmbedding` and `QKNormRoPE` (split QKV + per-head RMSNorm + rotary, fused)."""

from __future__ import annotations

import torch
import torch.nn as nn

from opcore.ir import ops
from opcore.ir.rope import build_cos_sin_cache
from opcore.layers.custom_op import CustomOp

__all__ = ["QKNormRoPE", "RotaryEmbedding", "build_cos_sin_cache"]


def _rotary_dim(head_size: int, rotary_dim: int | None) -> int:
    rotary_dim = head_size if rotary_dim is None else rotary_dim
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_size:
        raise ValueError(
            f"rotary_dim must be even, positive and at most head_size {head_size}, got {rotary_dim}"
        )
    return rotary_dim


@CustomOp.register("rotary_embedding")
class RotaryEmbedding(CustomOp):
    """Rotary position embedding over ``rotary_dim`` of each head's ``head_size``
    features (``rotary_dim < head_size``: partial rotary), NeoX or GPT-J style.

    The cos/sin cache (``[max_position, rotary_dim]``, fp32, from `build_cos_sin_cache`)
    is a non-persistent buffer. ``forward(positions, query, key=None)`` returns new
    ``(query, key)``."""

    ir_ops = ("rotary_embedding",)

    def __init__(
        self,
        head_size: int,
        rotary_dim: int | None = None,
        max_position: int = 4096,
        rope_theta: float = 10000.0,
        is_neox: bool = True,
        *,
        enforce_enable: bool = False,
    ):
        super().__init__(enforce_enable=enforce_enable)
        self.head_size = head_size
        self.rotary_dim = _rotary_dim(head_size, rotary_dim)
        self.max_position = max_position
        self.rope_theta = float(rope_theta)
        self.is_neox = bool(is_neox)
        self.register_buffer(
            "cos_sin_cache",
            build_cos_sin_cache(self.rotary_dim, max_position, self.rope_theta),
            persistent=False,
        )

    def forward_native(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None
    ):
        return ops.rotary_embedding(
            positions, query, key, self.head_size, self.cos_sin_cache, self.is_neox
        )

    def extra_repr(self) -> str:
        return (
            f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
            f"max_position={self.max_position}, rope_theta={self.rope_theta}, "
            f"is_neox={self.is_neox}"
        )


@CustomOp.register("split_qkv_rmsnorm_rope")
class QKNormRoPE(CustomOp):
    """Split a fused QKV projection ``[*, (num_heads + 2 * num_kv_heads) * head_size]``,
    RMS-normalize each q and k head (separate ``q_weight`` / ``k_weight`` of size
    ``head_size``), apply rotary embedding; ``forward(qkv, positions) -> (q, k, v)``."""

    ir_ops = ("split_qkv_rmsnorm_rope",)

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        eps: float = 1e-6,
        rotary_dim: int | None = None,
        max_position: int = 4096,
        rope_theta: float = 10000.0,
        is_neox: bool = True,
        dtype: torch.dtype | None = None,
        *,
        enforce_enable: bool = False,
    ):
        super().__init__(enforce_enable=enforce_enable)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.eps = float(eps)
        self.rotary_dim = _rotary_dim(head_size, rotary_dim)
        self.is_neox = bool(is_neox)
        self.q_weight = nn.Parameter(torch.ones(head_size, dtype=dtype))
        self.k_weight = nn.Parameter(torch.ones(head_size, dtype=dtype))
        self.register_buffer(
            "cos_sin_cache",
            build_cos_sin_cache(self.rotary_dim, max_position, float(rope_theta)),
            persistent=False,
        )

    def forward_native(self, qkv: torch.Tensor, positions: torch.Tensor):
        return ops.split_qkv_rmsnorm_rope(
            qkv,
            self.q_weight,
            self.k_weight,
            self.eps,
            positions,
            self.cos_sin_cache,
            self.num_heads,
            self.num_kv_heads,
            self.head_size,
            self.is_neox,
        )

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, is_neox={self.is_neox}"
        )
