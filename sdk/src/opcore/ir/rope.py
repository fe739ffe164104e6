"""Rotary-embedding helpers shared by the ops, their samples and the layers."""

from __future__ import annotations

import torch


def build_cos_sin_cache(
    rotary_dim: int,
    max_position: int,
    rope_theta: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The ``[max_position, rotary_dim]`` cache the rotary ops read: row ``p`` holds
    ``cos(p * f)`` then ``sin(p * f)`` for the ``rotary_dim // 2`` frequencies
    ``f_i = rope_theta ** (-2 i / rotary_dim)``. Computed in fp64, then cast."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(
            f"build_cos_sin_cache: rotary_dim must be even and positive, got {rotary_dim}"
        )
    if max_position <= 0:
        raise ValueError(f"build_cos_sin_cache: max_position must be positive, got {max_position}")
    inv_freq = rope_theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    return cache.to(dtype=dtype, device=device)


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool
) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` features of ``x`` (``[..., heads, head_size]``);
    ``cos``/``sin`` broadcast against ``[..., heads, rot_dim // 2]``. NeoX style pairs
    feature ``i`` with ``i + rot_dim // 2``; GPT-J style pairs ``2i`` with ``2i + 1``.
    Features past ``rot_dim`` pass through. Math in ``x``'s dtype (callers upcast)."""
    half = cos.shape[-1]
    rot, rest = x[..., : 2 * half], x[..., 2 * half :]
    if is_neox:
        x1, x2 = rot[..., :half], rot[..., half:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((out, rest), dim=-1)
