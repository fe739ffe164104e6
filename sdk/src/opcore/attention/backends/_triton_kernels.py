"""Triton kernels of ``TRITON_PAGED``. Imported only when Triton imports (see
`triton_paged`); ``TRITON_INTERPRET=1`` must be set before this module is first imported
for the kernels to run on the CPU interpreter.

Cache layout: key and value caches ``[num_blocks, block_size, num_kv_heads, head_size]``
(strides passed explicitly). Every kernel gathers keys one position at a time through
the block table (``block_table[seq, pos // block_size]``), so a tile of ``BLOCK_N`` keys
may span pages of any size.

Query rows are packed per kv head: row ``r`` of a program's tile is query token
``r // GROUP_PAD`` of its block and head ``kv_head * GROUP + r % GROUP_PAD``; that puts
the whole GQA group into the M dimension of ``tl.dot`` and reads each key/value tile once
for all of the group's heads. Softmax is online, in fp32, in the log2 domain.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _scores(q, k, qk_scale, SOFTCAP: tl.constexpr):
    # q [M, D] x k [D, N] -> scores in log2 units. Soft-cap acts on natural-unit scores:
    # c * tanh(s / c), with tanh(x) = 2 * sigmoid(2x) - 1 (no tanh on every target).
    s = tl.dot(q, k)
    if SOFTCAP > 0:
        s = s * (qk_scale / 1.4426950408889634)
        s = SOFTCAP * (2.0 * tl.sigmoid(2.0 * s / SOFTCAP) - 1.0)
        s = s * 1.4426950408889634
    else:
        s = s * qk_scale
    return s


@triton.jit
def _attend_tile(
    q,
    m_i,
    l_i,
    acc,
    start,
    hi,
    lo,
    q_pos,
    seq,
    kv_head,
    d,
    d_ok,
    K,
    V,
    block_table,
    qk_scale,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    block_size,
    window,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """One online-softmax step over keys ``start .. start + BLOCK_N`` (those in
    ``[lo, hi)`` and visible to each row). Returns the updated ``(m_i, l_i, acc)``."""
    kpos = start + tl.arange(0, BLOCK_N)
    k_ok = (kpos < hi) & (kpos >= lo)
    blk = tl.load(block_table + seq * stride_bt + kpos // block_size, mask=k_ok, other=0).to(
        tl.int64
    )
    slot = kpos % block_size
    k = tl.load(
        K + blk[None, :] * stride_kb + slot[None, :] * stride_ks + kv_head * stride_kh + d[:, None],
        mask=k_ok[None, :] & d_ok[:, None],
        other=0.0,
    )
    v = tl.load(
        V + blk[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
        mask=k_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if INTERPRET:
        # The interpreter computes on numpy, which has no bf16: do the math in fp32.
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = _scores(q, k, qk_scale, SOFTCAP)
    visible = k_ok[None, :]
    if CAUSAL:
        visible = visible & (kpos[None, :] <= q_pos[:, None])
    # window is the sliding window, or a huge number when there is none.
    visible = visible & (q_pos[:, None] - kpos[None, :] < window)
    if not CAUSAL:
        visible = visible & (kpos[None, :] - q_pos[:, None] < window)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row with nothing visible yet keeps m = -inf; subtract 0 instead to avoid NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _attend_range(
    q,
    m_i,
    l_i,
    acc,
    begin,
    hi,
    lo,
    q_pos,
    seq,
    kv_head,
    d,
    d_ok,
    K,
    V,
    block_table,
    qk_scale,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    block_size,
    window,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """`_attend_tile` over the tiles starting at ``begin, begin + BLOCK_N, ...`` below
    ``hi``. Returns the updated ``(m_i, l_i, acc)``."""
    # Loads feeding tl.dot in a `for` loop are software-pipelined on GPUs. The
    # interpreter cannot take a tensor loop bound under numpy >= 2.4 (triton-lang/triton
    # #9171), so it runs the same tile step in a `while` loop.
    if INTERPRET:
        start = begin
        while start < hi:
            m_i, l_i, acc = _attend_tile(
                q,
                m_i,
                l_i,
                acc,
                start,
                hi,
                lo,
                q_pos,
                seq,
                kv_head,
                d,
                d_ok,
                K,
                V,
                block_table,
                qk_scale,
                stride_kb,
                stride_ks,
                stride_kh,
                stride_vb,
                stride_vs,
                stride_vh,
                stride_bt,
                block_size,
                window,
                BLOCK_N,
                CAUSAL,
                SOFTCAP,
                INTERPRET,
            )
            start += BLOCK_N
    else:
        for start in range(begin, hi, BLOCK_N):
            m_i, l_i, acc = _attend_tile(
                q,
                m_i,
                l_i,
                acc,
                start,
                hi,
                lo,
                q_pos,
                seq,
                kv_head,
                d,
                d_ok,
                K,
                V,
                block_table,
                qk_scale,
                stride_kb,
                stride_ks,
                stride_kh,
                stride_vb,
                stride_vs,
                stride_vh,
                stride_bt,
                block_size,
                window,
                BLOCK_N,
                CAUSAL,
                SOFTCAP,
                INTERPRET,
            )
    return m_i, l_i, acc


@triton.jit
def _query_span(query_start_loc, seq):
    """First token of sequence ``seq`` in the packed query, and its query length."""
    q_begin = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_begin
    return q_begin, q_len


@triton.jit
def _load_q(Q, tok, stride_qt, head, stride_qh, d, mask, INTERPRET: tl.constexpr):
    """Query rows at token offset ``tok`` (one per row, or one for all), heads ``head``,
    columns ``d``."""
    q = tl.load(Q + tok * stride_qt + head[:, None] * stride_qh + d[None, :], mask=mask, other=0.0)
    if INTERPRET:
        # The interpreter computes on numpy, which has no bf16: do the math in fp32.
        q = q.to(tl.float32)
    return q


@triton.jit
def _normalised(acc, l_i):
    """``acc / l_i`` per row; a row that saw no key (``l_i`` and ``acc`` 0) gives zeros."""
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    return acc / l_safe[:, None]


@triton.jit
def _store_out(Out, tok, stride_ot, head, stride_oh, d, mask, out):
    """Store ``out`` in ``Out``'s dtype at the rows `_load_q` addresses."""
    tl.store(
        Out + tok * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(Out.dtype.element_ty),
        mask=mask,
    )


@triton.jit
def paged_attention_kernel(
    Q,
    K,
    V,
    Out,
    query_start_loc,
    seq_lens,
    block_table,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    block_size,
    window,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Mixed prefill/decode: grid (num_seqs, cdiv(max_query_len, BLOCK_Q), num_kv_heads)."""
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    seq = tl.program_id(0)
    qblock = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_begin, q_len = _query_span(query_start_loc, seq)
    if qblock * BLOCK_Q >= q_len:
        return
    ctx = tl.load(seq_lens + seq)

    rows = tl.arange(0, BLOCK_M)
    tok = qblock * BLOCK_Q + rows // GROUP_PAD
    g = rows % GROUP_PAD
    row_ok = (tok < q_len) & (g < GROUP)
    head = kv_head * GROUP + g
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD
    io_mask = row_ok[:, None] & d_ok[None, :]
    q_tok = (q_begin + tok).to(tl.int64)[:, None]
    q = _load_q(Q, q_tok, stride_qt, head, stride_qh, d, io_mask, INTERPRET)
    q_pos = ctx - q_len + tok  # absolute position of each row's token

    first_pos = ctx - q_len + qblock * BLOCK_Q
    last_pos = ctx - q_len + tl.minimum((qblock + 1) * BLOCK_Q, q_len) - 1
    if CAUSAL:
        hi = last_pos + 1
    else:
        hi = tl.minimum(ctx, last_pos + window)
    # Start at the tile holding the first key any row of this block can see.
    lo = tl.maximum(0, first_pos - window + 1)
    lo = (lo // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    m_i, l_i, acc = _attend_range(
        q,
        m_i,
        l_i,
        acc,
        lo,
        hi,
        lo,
        q_pos,
        seq,
        kv_head,
        d,
        d_ok,
        K,
        V,
        block_table,
        qk_scale,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_vb,
        stride_vs,
        stride_vh,
        stride_bt,
        block_size,
        window,
        BLOCK_N,
        CAUSAL,
        SOFTCAP,
        INTERPRET,
    )
    out = _normalised(acc, l_i)
    _store_out(Out, q_tok, stride_ot, head, stride_oh, d, io_mask, out)


@triton.jit(do_not_specialize=["num_splits"])
def paged_decode_kernel(
    Q,
    K,
    V,
    Out,
    Part_acc,
    Part_ml,
    query_start_loc,
    seq_lens,
    block_table,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_pa_s,
    stride_pa_h,
    stride_pa_p,
    stride_pm_s,
    stride_pm_h,
    block_size,
    window,
    num_splits,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SPLIT: tl.constexpr,
    INTERPRET: tl.constexpr,
    DECODE_ROWS_ONLY: tl.constexpr = False,
):
    """Decode (one new token per sequence), split-KV: grid (num_seqs, num_kv_heads,
    num_splits). Without SPLIT (one split) it writes the output; otherwise each split
    writes its unnormalised accumulator and (max, sum) for `paged_decode_reduce_kernel`.
    ``DECODE_ROWS_ONLY``: skip sequences with more than one new token (a mixed batch,
    whose other rows the prefill kernel serves)."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_begin, q_len = _query_span(query_start_loc, seq)
    if q_len == 0:
        return
    if DECODE_ROWS_ONLY:
        if q_len != 1:
            return
    ctx = tl.load(seq_lens + seq)

    g = tl.arange(0, BLOCK_H)
    row_ok = g < GROUP
    head = kv_head * GROUP + g
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD
    io_mask = row_ok[:, None] & d_ok[None, :]
    q_tok = q_begin.to(tl.int64)
    q = _load_q(Q, q_tok, stride_qt, head, stride_qh, d, io_mask, INTERPRET)

    lo = tl.maximum(0, ctx - window)
    # Each split takes a whole number of tiles of [lo, ctx).
    tiles = tl.cdiv(ctx - lo, BLOCK_N)
    per_split = tl.cdiv(tiles, num_splits)
    s_lo = lo + split * per_split * BLOCK_N
    s_hi = tl.minimum(ctx, s_lo + per_split * BLOCK_N)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_PAD], tl.float32)
    q_pos = tl.zeros([BLOCK_H], tl.int32) + ctx - 1
    m_i, l_i, acc = _attend_range(
        q,
        m_i,
        l_i,
        acc,
        s_lo,
        s_hi,
        lo,
        q_pos,
        seq,
        kv_head,
        d,
        d_ok,
        K,
        V,
        block_table,
        qk_scale,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_vb,
        stride_vs,
        stride_vh,
        stride_bt,
        block_size,
        window,
        BLOCK_N,
        True,
        SOFTCAP,
        INTERPRET,
    )

    if not SPLIT:
        _store_out(Out, q_tok, stride_ot, head, stride_oh, d, io_mask, _normalised(acc, l_i))
    else:
        tl.store(
            Part_acc
            + seq * stride_pa_s
            + head[:, None] * stride_pa_h
            + split * stride_pa_p
            + d[None, :],
            acc,
            mask=row_ok[:, None] & d_ok[None, :],
        )
        ml = Part_ml + seq * stride_pm_s + head * stride_pm_h + split * 2
        tl.store(ml, m_i, mask=row_ok)
        tl.store(ml + 1, l_i, mask=row_ok)


@triton.jit(do_not_specialize=["num_splits"])
def paged_decode_reduce_kernel(
    Out,
    Part_acc,
    Part_ml,
    query_start_loc,
    stride_ot,
    stride_oh,
    stride_pa_s,
    stride_pa_h,
    stride_pa_p,
    stride_pm_s,
    stride_pm_h,
    num_splits,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    DECODE_ROWS_ONLY: tl.constexpr = False,
):
    """Merge the splits of one (sequence, head): grid (num_seqs, num_heads)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_begin, q_len = _query_span(query_start_loc, seq)
    if q_len == 0:
        return
    if DECODE_ROWS_ONLY:
        if q_len != 1:
            return
    sp = tl.arange(0, SPLITS_PAD)
    sp_ok = sp < num_splits
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD
    ml = Part_ml + seq * stride_pm_s + head * stride_pm_h + sp * 2
    m = tl.load(ml, mask=sp_ok, other=float("-inf"))
    l_s = tl.load(ml + 1, mask=sp_ok, other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.math.exp2(m - m_max)  # empty splits have m = -inf -> weight 0
    acc = tl.load(
        Part_acc + seq * stride_pa_s + head * stride_pa_h + sp[:, None] * stride_pa_p + d[None, :],
        mask=sp_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    total = tl.sum(w * l_s, 0)
    total = tl.where(total == 0.0, 1.0, total)
    out = tl.sum(acc * w[:, None], 0) / total
    tl.store(
        Out + q_begin.to(tl.int64) * stride_ot + head * stride_oh + d,
        out.to(Out.dtype.element_ty),
        mask=d_ok,
    )


@triton.jit
def write_kv_kernel(
    Key,
    Value,
    KC,
    VC,
    slot_mapping,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    block_size,
):
    """Copy token ``t``'s key/value rows to slot ``slot_mapping[t]``; grid (num_tokens,).
    A negative slot is padding and is skipped."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping + t)
    if slot < 0:
        return
    blk = slot // block_size
    off = slot % block_size
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_PAD)
    ok = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD)
    k = tl.load(Key + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=ok)
    v = tl.load(Value + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=ok)
    tl.store(
        KC + blk * stride_kcb + off * stride_kcs + h[:, None] * stride_kch + d[None, :], k, mask=ok
    )
    tl.store(
        VC + blk * stride_vcb + off * stride_vcs + h[:, None] * stride_vch + d[None, :], v, mask=ok
    )
