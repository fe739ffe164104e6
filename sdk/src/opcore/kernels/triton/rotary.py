"""Rotary embedding (NeoX and GPT-J styles, partial rotary) on q and k.

``cos_sin_cache[max_pos, rot_dim]`` holds cos in its first half and sin in its second; a
token's row is picked by its position and loaded once per program, then reused for every
head the program covers. Both styles rotate pairs ``(a, b)`` of one head:
``a' = a cos - b sin``, ``b' = b cos + a sin``; NeoX pairs element ``i`` with ``i + rot/2``,
GPT-J pairs ``2i`` with ``2i + 1``. Elements past ``rot_dim`` are left as they are (copied
when the output is a new tensor).

Grid: ``(tokens, splits)``. Program ``(t, s)`` rotates q heads ``[s * BLOCK_Q, (s + 1) *
BLOCK_Q)`` and k heads ``[s * BLOCK_K, (s + 1) * BLOCK_K)`` of token ``t`` as two 2-D
``[heads, rot / 2]`` blocks after one load of the token's cos/sin row; with many tokens
there is one split, i.e. one program per token (`_launch.token_head_params`). q and k are
addressed by token and head strides, so slices of one QKV buffer are used where they lie.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opcore.kernels.triton import PROVIDER, _bound, _launch
from opcore.kernels.triton._support import head_layout
from opcore.tuning.runtime import launch_config


@triton.jit
def pair_offsets(HALF_PAD: tl.constexpr, half, IS_NEOX: tl.constexpr):
    """Columns of the two members of each rotated pair, and the lane mask."""
    j = tl.arange(0, HALF_PAD)
    if IS_NEOX:
        off_a = j
        off_b = j + half
    else:
        off_a = 2 * j
        off_b = 2 * j + 1
    return off_a, off_b, j < half


@triton.jit
def load_cos_sin(cache_ptr, cache_stride, pos, half, HALF_PAD: tl.constexpr):
    j = tl.arange(0, HALF_PAD)
    m = j < half
    row = cache_ptr + pos * cache_stride
    cos = tl.load(row + j, mask=m, other=0.0).to(tl.float32)
    sin = tl.load(row + half + j, mask=m, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def load_pairs(src, off_a, off_b, head_mask, pair_mask):
    """The two members ``(a, b)`` of each rotated pair of heads ``src`` (a ``[heads, 1]``
    block of row pointers), in fp32, and their mask."""
    m = head_mask[:, None] & pair_mask[None, :]
    a = tl.load(src + off_a[None, :], mask=m, other=0.0).to(tl.float32)
    b = tl.load(src + off_b[None, :], mask=m, other=0.0).to(tl.float32)
    return a, b, m


@triton.jit
def store_rotated(dst, a, b, cos, sin, off_a, off_b, m):
    """Store the rotated pairs ``a cos - b sin`` and ``b cos + a sin`` in ``dst``'s dtype.

    Each is one fused multiply-add written out, ``fma(a, cos, -(b sin))`` and ``fma(b,
    cos, a sin)``: left as ``a * c - b * s``, the compiler may fuse either product into the
    sum, and its choice followed the launch configuration (on an H100 1-2 warps against
    4-8 changed the last bit of a few elements: bench/head_exactness.py), so a token's
    result followed the batch's size, which the declared batch invariance rules out."""
    c = cos[None, :]
    s = sin[None, :]
    tl.store(dst + off_a[None, :], tl.fma(a, c, -(b * s)).to(dst.dtype.element_ty), mask=m)
    tl.store(dst + off_b[None, :], tl.fma(b, c, a * s).to(dst.dtype.element_ty), mask=m)


@triton.jit
def rope_heads(
    in_ptr,
    in_tok,
    in_head,
    out_ptr,
    out_tok,
    out_head,
    tok,
    heads,
    head_mask,
    cos,
    sin,
    off_a,
    off_b,
    pair_mask,
    rot,
    head_size,
    COPY_TAIL: tl.constexpr,
    TAIL_PAD: tl.constexpr,
):
    """Rotate ``heads`` of token ``tok``; copy the unrotated tail when ``COPY_TAIL``."""
    src = in_ptr + tok * in_tok + heads[:, None] * in_head
    dst = out_ptr + tok * out_tok + heads[:, None] * out_head
    a, b, m = load_pairs(src, off_a, off_b, head_mask, pair_mask)
    store_rotated(dst, a, b, cos, sin, off_a, off_b, m)
    if COPY_TAIL:
        t = rot + tl.arange(0, TAIL_PAD)
        tm = head_mask[:, None] & (t < head_size)[None, :]
        tail = tl.load(src + t[None, :], mask=tm, other=0.0)
        tl.store(dst + t[None, :], tail.to(out_ptr.dtype.element_ty), mask=tm)


@triton.jit
def _rotary_kernel(
    pos_ptr,
    cache_ptr,
    cache_stride,
    q_ptr,
    q_tok,
    q_head,
    qo_ptr,
    qo_tok,
    qo_head,
    n_q_heads,
    k_ptr,
    k_tok,
    k_head,
    ko_ptr,
    ko_tok,
    ko_head,
    n_k_heads,
    rot,
    half,
    head_size,
    IS_NEOX: tl.constexpr,
    HAS_KEY: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HALF_PAD: tl.constexpr,
    COPY_TAIL: tl.constexpr,
    TAIL_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cos, sin = load_cos_sin(cache_ptr, cache_stride, pos, half, HALF_PAD)
    off_a, off_b, pair_mask = pair_offsets(HALF_PAD, half, IS_NEOX)
    heads = split * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rope_heads(
        q_ptr,
        q_tok,
        q_head,
        qo_ptr,
        qo_tok,
        qo_head,
        tok,
        heads,
        heads < n_q_heads,
        cos,
        sin,
        off_a,
        off_b,
        pair_mask,
        rot,
        head_size,
        COPY_TAIL,
        TAIL_PAD,
    )
    if HAS_KEY:
        heads = split * BLOCK_K + tl.arange(0, BLOCK_K)
        rope_heads(
            k_ptr,
            k_tok,
            k_head,
            ko_ptr,
            ko_tok,
            ko_head,
            tok,
            heads,
            heads < n_k_heads,
            cos,
            sin,
            off_a,
            off_b,
            pair_mask,
            rot,
            head_size,
            COPY_TAIL,
            TAIL_PAD,
        )


def _layout(t, n_tokens, head_size, name):
    lay = head_layout(t, n_tokens, head_size)
    if lay is None:
        raise ValueError(
            f"rotary_embedding: {name} of shape {tuple(t.shape)} and strides {t.stride()} is not "
            f"[{n_tokens} tokens, heads, {head_size}] with a contiguous last dim"
        )
    return lay


def _rotary(positions, query, key, head_size, cos_sin_cache, is_neox, q_out, k_out):
    n_tokens = positions.numel()
    rot = cos_sin_cache.shape[-1]
    half = rot // 2
    q_tok, q_head, n_q = _layout(query, n_tokens, head_size, "query")
    qo_tok, qo_head, _ = _layout(q_out, n_tokens, head_size, "query output")
    if key is not None:
        k_tok, k_head, n_k = _layout(key, n_tokens, head_size, "key")
        ko_tok, ko_head, _ = _layout(k_out, n_tokens, head_size, "key output")
    else:
        k_tok = k_head = ko_tok = ko_head = n_k = 0
    if n_tokens == 0 or (n_q == 0 and n_k == 0):
        return
    half_pad = _launch.next_pow2(half)
    tail = head_size - rot
    copy_tail = tail > 0 and q_out.data_ptr() != query.data_ptr()
    # A tuned choice for this size (docs/tuning.md), else the shape heuristic.
    cfg = launch_config(
        "rotary_embedding", PROVIDER, query.dtype, n_tokens, (n_q, n_k, int(head_size))
    )
    if cfg is None:
        n_splits, block_q, block_k, warps = _launch.token_head_params(
            n_tokens, n_q, n_k, 2 * half_pad, _launch.multiprocessors(query.device.index)
        )
    else:
        n_splits, block_q, block_k = _launch.head_split(n_q, n_k, cfg["SPLITS"])
        warps = cfg["num_warps"]
    # The kernel reads positions as one contiguous array; a strided or expanded view (a
    # decode position broadcast over the batch) must not be read past its elements.
    pos = positions.reshape(-1).contiguous()
    _bound.launch(
        _rotary_kernel,
        (n_tokens, n_splits),
        pos,
        cos_sin_cache,
        cos_sin_cache.stride(0),
        query,
        q_tok,
        q_head,
        q_out,
        qo_tok,
        qo_head,
        n_q,
        key if key is not None else query,
        k_tok,
        k_head,
        k_out if k_out is not None else q_out,
        ko_tok,
        ko_head,
        n_k,
        rot,
        half,
        head_size,
        IS_NEOX=bool(is_neox),
        HAS_KEY=n_k > 0,
        BLOCK_Q=block_q,
        BLOCK_K=block_k,
        HALF_PAD=half_pad,
        COPY_TAIL=copy_tail,
        TAIL_PAD=_launch.next_pow2(max(tail, 1)),
        num_warps=warps,
    )


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    """`rotary_embedding` into new tensors shaped like ``query`` and ``key``."""
    q_out = _bound.empty(query.shape, dtype=query.dtype, device=query.device)
    k_out = None if key is None else _bound.empty(key.shape, dtype=key.dtype, device=key.device)
    _rotary(positions, query, key, head_size, cos_sin_cache, is_neox, q_out, k_out)
    return q_out, k_out


def rotary_embedding_inplace(positions, query, key, head_size, cos_sin_cache, is_neox):
    """In-place `rotary_embedding`: rotates ``query`` and ``key`` where they lie (slices of
    a QKV buffer included) and returns them."""
    _rotary(positions, query, key, head_size, cos_sin_cache, is_neox, query, key)
    return query, key


def rotary_supported_layout(positions, query, key, head_size, cos_sin_cache) -> bool:
    """Metadata check shared with the fused split: shapes, strides and the cache width."""
    n_tokens = positions.numel()
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[-1] % 2:
        return False
    rot = cos_sin_cache.shape[-1]
    if rot == 0 or rot > head_size or cos_sin_cache.stride(-1) != 1:
        return False
    if head_layout(query, n_tokens, head_size) is None:
        return False
    return key is None or head_layout(key, n_tokens, head_size) is not None
