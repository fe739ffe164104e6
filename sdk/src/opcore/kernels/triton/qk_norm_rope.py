"""`split_qkv_rmsnorm_rope` as one kernel: split a packed QKV row, RMSNorm each q and k
head over ``head_size`` with per-head-dim weights, apply rotary, copy v.

Grid ``(tokens, splits)``: program ``(t, s)`` loads token ``t``'s cos/sin row once and
handles q heads ``[s * BLOCK_Q, (s + 1) * BLOCK_Q)`` and k and v heads ``[s * BLOCK_KV,
(s + 1) * BLOCK_KV)``, each group as one 2-D ``[heads, columns]`` block; with many tokens
there is one split, i.e. one program per token (`_launch.split_qkv_params`).

Each q/k head is loaded once as its two rotary halves (``a``, ``b``, paired as in
`rotary`) and its unrotated tail; the sum of squares over the three parts gives the
head's RMS, and the normalised values stay in fp32 registers through the rotation, so the
only memory traffic is one read of q, k, v and one write of each output.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opcore.kernels.triton import PROVIDER, _bound, _launch
from opcore.kernels.triton._support import require_row_stride
from opcore.kernels.triton.rotary import load_cos_sin, load_pairs, pair_offsets, store_rotated
from opcore.tuning.runtime import launch_config


@triton.jit
def _norm_rope_heads(
    src_row,
    dst_row,
    w_ptr,
    heads,
    head_mask,
    cos,
    sin,
    off_a,
    off_b,
    pair_mask,
    eps,
    rot,
    head_size,
    HAS_WEIGHT: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    TAIL_PAD: tl.constexpr,
):
    src = src_row + heads[:, None] * head_size
    dst = dst_row + heads[:, None] * head_size
    a, b, m = load_pairs(src, off_a, off_b, head_mask, pair_mask)
    ss = tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)
    if HAS_TAIL:
        t = rot + tl.arange(0, TAIL_PAD)
        tmask = t < head_size
        tm = head_mask[:, None] & tmask[None, :]
        tail = tl.load(src + t[None, :], mask=tm, other=0.0).to(tl.float32)
        ss += tl.sum(tail * tail, axis=1)
    rstd = tl.rsqrt(ss / tl.cast(head_size, tl.float32) + eps)[:, None]
    a = a * rstd
    b = b * rstd
    if HAS_WEIGHT:
        a = a * tl.load(w_ptr + off_a, mask=pair_mask, other=0.0).to(tl.float32)[None, :]
        b = b * tl.load(w_ptr + off_b, mask=pair_mask, other=0.0).to(tl.float32)[None, :]
    store_rotated(dst, a, b, cos, sin, off_a, off_b, m)
    if HAS_TAIL:
        tail = tail * rstd
        if HAS_WEIGHT:
            tail = tail * tl.load(w_ptr + t, mask=tmask, other=0.0).to(tl.float32)[None, :]
        tl.store(dst + t[None, :], tail.to(dst_row.dtype.element_ty), mask=tm)


@triton.jit
def _split_qkv_rmsnorm_rope_kernel(
    qkv_ptr,
    qkv_stride,
    q_ptr,
    k_ptr,
    v_ptr,
    qw_ptr,
    kw_ptr,
    pos_ptr,
    cache_ptr,
    cache_stride,
    eps,
    n_q_heads,
    n_kv_heads,
    head_size,
    rot,
    half,
    IS_NEOX: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    TAIL_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    eps = tl.cast(eps, tl.float32)
    tok = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    q_width = n_q_heads * head_size
    kv_width = n_kv_heads * head_size
    row = qkv_ptr + tok * qkv_stride
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cos, sin = load_cos_sin(cache_ptr, cache_stride, pos, half, HALF_PAD)
    off_a, off_b, pair_mask = pair_offsets(HALF_PAD, half, IS_NEOX)
    heads = split * BLOCK_Q + tl.arange(0, BLOCK_Q)
    _norm_rope_heads(
        row,
        q_ptr + tok * q_width,
        qw_ptr,
        heads,
        heads < n_q_heads,
        cos,
        sin,
        off_a,
        off_b,
        pair_mask,
        eps,
        rot,
        head_size,
        HAS_WEIGHT,
        HAS_TAIL,
        TAIL_PAD,
    )
    heads = split * BLOCK_KV + tl.arange(0, BLOCK_KV)
    kv_mask = heads < n_kv_heads
    _norm_rope_heads(
        row + q_width,
        k_ptr + tok * kv_width,
        kw_ptr,
        heads,
        kv_mask,
        cos,
        sin,
        off_a,
        off_b,
        pair_mask,
        eps,
        rot,
        head_size,
        HAS_WEIGHT,
        HAS_TAIL,
        TAIL_PAD,
    )
    cols = tl.arange(0, HEAD_PAD)
    m = kv_mask[:, None] & (cols < head_size)[None, :]
    off = heads[:, None] * head_size + cols[None, :]
    v = tl.load(row + q_width + kv_width + off, mask=m, other=0.0)
    tl.store(v_ptr + tok * kv_width + off, v, mask=m)


def split_qkv_rmsnorm_rope(
    qkv,
    q_weight,
    k_weight,
    epsilon,
    positions,
    cos_sin_cache,
    num_heads,
    num_kv_heads,
    head_size,
    is_neox,
):
    """`split_qkv_rmsnorm_rope` on a Triton device: new contiguous ``(q, k, v)`` shaped
    ``qkv.shape[:-1] + (heads * head_size,)``."""
    lead = tuple(qkv.shape[:-1])
    q = _bound.empty((*lead, num_heads * head_size), dtype=qkv.dtype, device=qkv.device)
    k = _bound.empty((*lead, num_kv_heads * head_size), dtype=qkv.dtype, device=qkv.device)
    v = _bound.empty((*lead, num_kv_heads * head_size), dtype=qkv.dtype, device=qkv.device)
    n_tokens = positions.numel()
    if n_tokens == 0:
        return q, k, v
    stride = require_row_stride(qkv, "split_qkv_rmsnorm_rope: qkv")
    rot = cos_sin_cache.shape[-1]
    half = rot // 2
    half_pad = _launch.next_pow2(half)
    tail = head_size - rot
    # A tuned choice for this size (docs/tuning.md), else the shape heuristic.
    cfg = launch_config(
        "split_qkv_rmsnorm_rope",
        PROVIDER,
        qkv.dtype,
        n_tokens,
        (int(num_heads), int(num_kv_heads), int(head_size)),
    )
    if cfg is None:
        sms = _launch.multiprocessors(qkv.device.index)
        n_splits, block_q, block_kv, warps = _launch.split_qkv_params(
            n_tokens, num_heads, num_kv_heads, 2 * half_pad, sms
        )
    else:
        n_splits, block_q, block_kv = _launch.head_split(num_heads, num_kv_heads, cfg["SPLITS"])
        warps = cfg["num_warps"]
    has_weight = q_weight is not None
    _bound.launch(
        _split_qkv_rmsnorm_rope_kernel,
        (n_tokens, n_splits),
        qkv,
        stride,
        q,
        k,
        v,
        q_weight if has_weight else qkv,
        k_weight if has_weight else qkv,
        # positions are read as one contiguous array (a strided or expanded view is not)
        positions.reshape(-1).contiguous(),
        cos_sin_cache,
        cos_sin_cache.stride(0),
        float(epsilon),
        num_heads,
        num_kv_heads,
        head_size,
        rot,
        half,
        IS_NEOX=bool(is_neox),
        HAS_WEIGHT=has_weight,
        BLOCK_Q=block_q,
        BLOCK_KV=block_kv,
        HALF_PAD=half_pad,
        HAS_TAIL=tail > 0,
        TAIL_PAD=_launch.next_pow2(max(tail, 1)),
        HEAD_PAD=_launch.next_pow2(head_size),
        num_warps=warps,
    )
    return q, k, v
