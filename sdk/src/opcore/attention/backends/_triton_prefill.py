"""``TRITON_PAGED``'s prefill kernel: FlashAttention-style tiles that read the paged KV
cache in place (no gather into a contiguous copy). Imported only when Triton imports (see
`triton_paged`); ``TRITON_INTERPRET=1`` must be set before the first import for the kernel
to run on the CPU interpreter.

What it computes, per query head ``h`` (kv head ``h // GROUP``) and new token ``i`` of a
sequence with ``q_len`` new tokens over ``ctx`` tokens of context (new ones included), at
absolute position ``p = ctx - q_len + i`` (bottom-right aligned: a chunk of a longer
prompt sees the cached prefix, and its own earlier tokens)::

    s_j   = scale * q_i . k_j                       (soft-capped: c * tanh(s_j / c))
    V(i)  = { j : 0 <= j < ctx, p - j < window, and j <= p (causal)
                                               or  j - p < window (non-causal) }
    out_i = sum_{j in V(i)} softmax_j(s) v_j

It is evaluated with an online softmax in base 2 (``exp2``, the scale folded into
``qk_scale = scale * log2(e)`` and applied in the exponent's multiply-add), fp32
accumulation, one program per (query head, tile of ``BLOCK_M`` new tokens of one sequence),
or per (kv head, tile of ``BLOCK_M // GROUP`` tokens x its ``GROUP`` query heads) with
packed query heads; `prefill_launch_config` picks the tiles.

Key tiles (``BLOCK_N`` positions, aligned to ``BLOCK_N``) are read as whole runs of pages
(``PAGE_MODE``):

- 1: ``block_size`` divides ``BLOCK_N``: the tile covers ``BLOCK_N // block_size`` whole
  pages; the block ids are read per position with the page size a compile-time constant;
- 2: ``BLOCK_N`` divides ``block_size``: one block id per tile, contiguous rows;
- 0: any other page size: one block-table entry per key position.

K is read key-major, like V, and transposed for the product; K and V share one walk of the
block table when their strides agree. Where the page size is a multiple of ``BLOCK_N`` and
the caller allows (``KV_TMA``: the platform's device copies tensor-descriptor tiles in
hardware), each K and V tile is one copy through a descriptor over the kv head's
``[blocks * block_size, head_size]`` rows instead.

A query tile walks three ranges of key tiles: tiles cut by the sliding window's lower
edge (masked), tiles every row of the tile sees whole (no mask: no ``where``, no masked
loads), then the tiles on the causal diagonal (or past the context's end, or cut by a
non-causal window's upper edge), masked. Tiles no row sees are never visited. A masked load
reads zeros (``other=0``) and masked scores are ``-inf``, so NaN in unused cache slots never
reaches the result.

Varlen batches: a tile holds ``BLOCK_Q`` new tokens (``BLOCK_M``, or ``BLOCK_M // GROUP``
with packed query heads: `paged_prefill_kernel`); the flat grid axis 1 has ``num_tokens //
BLOCK_Q + num_seqs`` tiles; sequence ``s`` owns tiles ``query_start_loc[s] // BLOCK_Q + s``
onwards (at least ``cdiv(q_len, BLOCK_Q)`` of them), and a program finds its sequence from
``query_start_loc`` on the device (one vector load for up to `SEQ_SCAN` sequences, else a
binary search): no host copy of the lengths is needed. Tiles are visited last first (the
longest causal tiles start first). ``SKIP_DECODE_ROWS`` leaves sequences with
one new token to the decode kernel (mixed batches, see `triton_paged`). With ``LATE_ROWS``
the output's row offsets and mask are worked out again after the key loop: held through
it, they take registers the tile needs.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from opcore.kernels.triton import _bound, _launch

LOG2E = 1.4426950408889634
# Batches of 2 to this many sequences find a tile's sequence with one vector load of
# `query_start_loc` (one constant: no recompile as the batch size changes); larger ones
# binary-search it, and one sequence needs neither (the search ends before its first load).
SEQ_SCAN = 64
# Batches whose every context is at most this many keys run head size 128 on the
# short-context tiles (`prefill_launch_config`, `short_context_tiles`).
SHORT_CONTEXT = 1024


@dataclasses.dataclass(frozen=True)
class PrefillLaunch:
    """Tile sizes and launch settings of `paged_prefill_kernel` (``page_mode``: None picks
    `page_mode`; an int forces one, for sweeps: 0 works for every page size; ``kv_tma``:
    K and V tiles through tensor descriptors, for page sizes that are multiples of
    ``block_n`` and caches `tma_ready` accepts; ``pack_gqa``: a tile's rows are
    ``block_m // group`` tokens x the query heads of one kv head, where a kv head serves
    2 to ``block_m`` query heads (else ignored); ``seq_scan``: batches of 2 to `SEQ_SCAN`
    sequences find a tile's sequence with one vector load; ``late_rows``: the output's row
    offsets are worked out again after the key loop instead of held in registers through
    it)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    page_mode: int | None = None
    kv_tma: bool = False
    pack_gqa: bool = False
    seq_scan: bool = True
    late_rows: bool = False


def prefill_launch_config(
    head_size: int,
    dtype: torch.dtype,
    block_size: int = 1,
    kv_descriptors: bool = False,
    row_tiles_per_sm: float = float("inf"),
    short_context: bool = False,
) -> PrefillLaunch:
    """The prefill launch for a head size, dtype and page size (the interpreter ignores
    warps and stages but uses the same tiles, so the CPU tests cover the GPU's tile edges).
    ``kv_descriptors``: K and V may be read through tensor descriptors (the platform's
    `~opcore.platforms.Platform.tensor_descriptor_copies` and `tma_ready`).
    ``short_context``: no sequence of the batch has more than `SHORT_CONTEXT` keys
    (`short_context_tiles`; the backend decides it once per batch, in its plan).

    **Short contexts at head size 128** (padded 128, ``short_context``), on every page
    size: 64 x 32 pointer tiles, 4 warps, 2 stages, packed, rows late. On an H100
    (2026-12-07, ``bench/attention_prefill.py --interleave 10``,
    ``bench/results/2026-12-07-h100-session17/``) they ran 16 x 1024 at 274-281 TFLOP/s on
    pages of 16 (SDPA flash 261-278) and, in the same passes, 321-336 against the
    descriptor tiles' 278-298 on pages of 64 and 128 with 32/8 and 64/8 heads (271-273
    against 274-277 with 28/4). The same tiles on longer contexts lost: chunks over 4k-33k
    prefixes ran 11-32 % slower than 64 x 64 had on another H100 that morning (0.82-1.00x
    SDPA flash on pages of 16) and whole 8k-32k prompts up to 5 % slower, so those keep the
    tiles below.

    Where they may and a page holds whole 64-key tiles (a page size that is a multiple of
    64), key tiles are read through descriptors, one copy per tile:

    ===========  =======  =======  =====  ======
    head (pad)   BLOCK_M  BLOCK_N  warps  stages
    ===========  =======  =======  =====  ======
    <= 128       128      64       4      3
    > 128 (256)  128      64       8      3
    ===========  =======  =======  =====  ======

    with 64-row tiles instead where 128-row tiles would give fewer than two programs per
    multiprocessor (``row_tiles_per_sm``: query heads x 128-row tiles per multiprocessor):
    a short chunk over a long prefix (512 tokens, 32 heads: 128 programs on an H100's 132
    multiprocessors) ran at 0.64-0.70x the pointer kernel's 64-row tiles with 128 rows.

    From sweeps on an H100 (``--sweep --sweep-set tma``, 2026-12-06; 32/8 heads, bf16, pages
    of 128): head size 128 442 against 357 TFLOP/s for the pointer kernel at 1 x 8192, 403
    against 323 at 4 x 4096, 258 against 254 at 16 x 1024; 64: 360 against 327 and 203
    against 184; 256: 506 against 445 and 290 against 292. On 8 warps head size 128 ran
    at 342; 128-key tiles spill (141). Pages of fewer keys than a tile would need one copy
    per page (Hopper's copies cannot gather rows): four copies of 16-key pages per tile ran
    at 286 against the pointer kernel's 326 (1 x 8192), so those pages keep the pointers.
    Triton's warp specialisation of the key loop did not change the time on 8 warps and
    did not compile on 4.

    Otherwise the pointer kernel:

    ===========  =======  =======  =====  ======
    head (pad)   BLOCK_M  BLOCK_N  warps  stages
    ===========  =======  =======  =====  ======
    <= 64        128      128      4      3
    <= 128       64       64       4      2
    > 128 (256)  128      64       8      2
    ===========  =======  =======  =====  ======

    From sweeps on an H200 (``bench/attention_prefill.py --sweep``; 32/8 heads, bf16; 4 x
    4096 and 16 x 1024 tokens at head size 128, 1 x 8192 and 16 x 1024 at 64 and 256;
    pages of 16 and 128). Head size 128: 64 x 64 on 4 warps, 2 stages, was best or within
    1 % at every point (316-358 TFLOP/s at 4 x 4096; at 16 x 1024 229-254 against 174-238
    for 128-row tiles, whose causal tail is half empty on 1024-token sequences). Head size
    64: 128 x 128 on 4 warps (338 against 276 for 128 x 64 at 1 x 8192). Head size 256:
    128 x 64 on 8 warps, 2 stages (403-434 TFLOP/s against 157-201 for 64 x 64; 128 rows
    of 256 fp32 accumulators fit across 8 warps, and a narrower key tile halves the work
    per block-table read). The page size no longer changes the choice.

    The short-context tiles above come from two H100 sweeps of 2026-12-07 (``--sweep-set
    short``, bf16, pages of 16; ``bench/results/2026-12-07-h100-session16/``): 64 x 32 on
    4 warps, 2 stages, ran at 277-281 TFLOP/s against 269 for 64 x 64 at 16 x 1024 with
    32/8 heads, 283-284 against 261 with 64/8, 272-276 against 257-259 with 28/4 (SDPA
    flash 266-282). The earlier sweeps had timed 64 x 32 only on 3 stages, which stays
    slower here too (256-280 at 16 x 1024). Adopted for every context at first, it cost
    the chunks and the long prompts what the paragraph above says.

    fp32 (not a dtype
    ``TRITON_PAGED`` supports today) would halve ``BLOCK_N``. docs/attention.md; the
    sweep re-recorded on 2026-12-04 (``bench/results/2026-12-04-h200/``) found that day's
    tiles best or within 2.5 % at every point it timed.

    **Packed query heads** (``pack_gqa``, where a kv head serves several query heads) on
    every descriptor launch and on the pointer launches of head sizes above 64. From the
    H100 sweep of 2026-12-06 (``--sweep-set pack``, 32/8 heads, bf16;
    ``bench/results/2026-12-06-h100-prefill-pack/``), the same tiles packed against not:
    descriptors 281 against 258 TFLOP/s at 16 x 1024 and 427 against 420 at 4 x 4096
    (head size 128), 318 against 289 (256); pointers, pages of 16, 257 against 255 at
    16 x 1024, 347 against 341 at 4 x 4096 (128), 312 against 302 (256). Head size 64's
    128 x 128 pointer tiles stay unpacked (packed: 205 against 210 at 16 x 1024).

    **The output's rows worked out after the key loop** (``late_rows``) on the 128-row
    descriptor tiles and the pointer tiles of head sizes 64 and 128. Held through the loop,
    the rows' offsets and mask cost registers the tile needs: compiled for sm_90
    (`bench/prefill_registers.py`), the 128-row descriptor tile at head size 128 spills
    392 bytes with them and 256 without, head size 64's 128 x 128 pointer tile 336 and 8.
    From H100 sweeps of 2026-12-06 (``--sweep-set rows``, bf16, TFLOP/s, late rows against
    not; ``bench/results/2026-12-06-h100-late-rows/``): descriptors 451 against 388 at 4 x
    4096 and 295 against 284 at 16 x 1024 (32/8 heads), 279 against 248 at 16 x 1024 with
    28/4 heads (groups of 7, which spilled 700 bytes), 333 against 304 at head size 256,
    230 against 228 at 64; pointers at head size 128 267 against 257 (pages of 16, 32/8)
    and 260 against 245 (28/4), 369 both at 4 x 4096; at head size 64 380 against 353
    (1 x 8192) and 238 against 207 (16 x 1024). Head size 256's pointer tiles keep their
    rows (324 against 332 with late rows), as do the 64-row descriptor tiles (not swept).
    Two other layouts for a group of 7 lost in the same sweep: 16 tokens a 128-row tile
    (239) and each token padded to 8 rows (252; 264 with late rows).
    """
    pad = head_pad(head_size)
    short = short_context and pad == 128  # the pointer tiles below, whatever the pages
    if kv_descriptors and block_size % 64 == 0 and dtype != torch.float32 and not short:
        if row_tiles_per_sm < 2:
            return PrefillLaunch(64, 64, 4, 3, kv_tma=True, pack_gqa=True)
        return PrefillLaunch(
            128, 64, 4 if pad <= 128 else 8, 3, kv_tma=True, pack_gqa=True, late_rows=True
        )
    if pad <= 64:
        cfg = PrefillLaunch(128, 128, 4, 3, late_rows=True)
    elif pad <= 128:
        cfg = PrefillLaunch(64, 32 if short else 64, 4, 2, pack_gqa=True, late_rows=True)
    else:
        cfg = PrefillLaunch(128, 64, 8, 2, pack_gqa=True)
    if dtype == torch.float32:
        cfg = dataclasses.replace(cfg, block_n=cfg.block_n // 2)
    return cfg


def short_context_tiles(head_size: int, max_seq_len: int) -> bool:
    """Whether a batch whose longest context is ``max_seq_len`` keys runs head size
    ``head_size`` on `prefill_launch_config`'s short-context tiles. The key tile's width
    sets the order of the online softmax's sums, so a sequence's output depends on this
    choice: a backend that declares batch invariance must not let it follow the batch."""
    return head_pad(head_size) == 128 and max_seq_len <= SHORT_CONTEXT


def head_pad(head_size: int) -> int:
    """The kernel's head columns: ``head_size`` rounded up to a power of two, at least 16
    (``tl.dot``'s smallest K)."""
    return max(16, 1 << max(0, (head_size - 1).bit_length()))


def page_mode(block_size: int, block_n: int) -> int:
    """`paged_prefill_kernel`'s ``PAGE_MODE`` for a page size (module docstring)."""
    if block_n % block_size == 0:
        return 1
    if block_size % block_n == 0:
        return 2
    return 0


@triton.jit
def _kv_rows(
    bt_row,
    start,
    kpos,
    n_pages,
    block_size,
    stride_b,
    stride_s,
    BLOCK_N: tl.constexpr,
    PAGE_MODE: tl.constexpr,
    PAGE: tl.constexpr,
):
    """Element offsets of key positions ``kpos = start + arange(BLOCK_N)`` in a cache of
    block stride ``stride_b`` and slot stride ``stride_s`` (``[BLOCK_N]``, int64)."""
    if PAGE_MODE == 1:
        # A run of BLOCK_N // PAGE whole pages. Their ids are read per key position with a
        # compile-time page size (shifts, the same few entries, cached): on an H200 this
        # beat loading the BLOCK_N // PAGE ids and expanding them with tl.reshape (240 vs
        # 169 TFLOP/s at 4 x 4096, 32/8 x 128, bf16, block 16), which adds a layout change.
        page = kpos // PAGE
        ids = tl.load(bt_row + page, mask=page < n_pages, other=0).to(tl.int64)
        return ids * stride_b + (kpos % PAGE).to(tl.int64) * stride_s
    elif PAGE_MODE == 2:
        # The tile lies in one page.
        blk = tl.load(bt_row + start // PAGE).to(tl.int64)
        return blk * stride_b + ((start % PAGE) + tl.arange(0, BLOCK_N)).to(tl.int64) * stride_s
    else:
        ok = kpos // block_size < n_pages
        blk = tl.load(bt_row + kpos // block_size, mask=ok, other=0).to(tl.int64)
        return blk * stride_b + (kpos % block_size).to(tl.int64) * stride_s


@triton.jit
def _step(
    q,
    m_i,
    l_i,
    acc,
    start,
    q_pos,
    ctx,
    window,
    bt_row,
    n_pages,
    block_size,
    K,
    V,
    kv_head,
    d,
    qk_scale,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    BLOCK_N: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    PAGE_MODE: tl.constexpr,
    PAGE: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    INTERPRET: tl.constexpr,
    KV_TMA: tl.constexpr,
    SAME_STRIDES: tl.constexpr,
):
    """One online-softmax step over key tile ``start .. start + BLOCK_N``. Unmasked
    (``MASKED`` False) only where every row of the tile sees every key of it."""
    kpos = start + tl.arange(0, BLOCK_N)
    if KV_TMA:
        # The tile lies in one page (PAGE is a multiple of BLOCK_N): BLOCK_N rows of the
        # kv head's [blocks * PAGE, HEAD] view, one descriptor copy each for K and V
        # (columns past HEAD read as zeros).
        row = tl.load(bt_row + start // PAGE) * PAGE + start % PAGE
        k = tl.trans(K.load([row, 0]))
        v = V.load([row, 0])
        if MASKED:
            k_ok = kpos < ctx
            # A whole page is read: a spare slot's NaN would reach acc through p = 0 * v.
            v = tl.where(k_ok[:, None], v, 0.0)
    else:
        k_rows = _kv_rows(
            bt_row, start, kpos, n_pages, block_size, stride_kb, stride_ks, BLOCK_N, PAGE_MODE,
            PAGE,
        )  # fmt: skip
        if SAME_STRIDES:  # K and V halves of one cache: one walk of the block table
            v_rows = k_rows
        else:
            v_rows = _kv_rows(
                bt_row, start, kpos, n_pages, block_size, stride_vb, stride_vs, BLOCK_N,
                PAGE_MODE, PAGE,
            )  # fmt: skip
        v_ptr = V + kv_head * stride_vh + v_rows[:, None] + d[None, :]
        # K is read key-major like V (each key's head_size values contiguous) and
        # transposed for the product: on an H100 this, with the one block-table walk, ran
        # 12-17 % faster at head sizes 128 and 256 (2 % at 64) than reading K head-major,
        # with bitwise the same results (bench/results/2026-12-06-h100-descriptors).
        k_ptr = K + kv_head * stride_kh + k_rows[:, None] + d[None, :]
        if MASKED:
            k_ok = kpos < ctx
            k = tl.load(k_ptr, mask=k_ok[:, None] & (d[None, :] < HEAD), other=0.0)
            v = tl.load(v_ptr, mask=k_ok[:, None] & (d[None, :] < HEAD), other=0.0)
        elif HEAD != HEAD_PAD:
            k = tl.load(k_ptr, mask=d[None, :] < HEAD, other=0.0)
            v = tl.load(v_ptr, mask=d[None, :] < HEAD, other=0.0)
        else:
            k = tl.load(k_ptr)
            v = tl.load(v_ptr)
        k = tl.trans(k)
    if INTERPRET:
        # The interpreter computes on numpy, which has no bf16: do the math in fp32.
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, k)
    if SOFTCAP > 0:
        # c * tanh(x / c) on natural-unit scores, tanh(y) = 2 sigmoid(2y) - 1.
        s = s * (qk_scale / 1.4426950408889634)
        s = (SOFTCAP * (2.0 * tl.sigmoid(2.0 * s / SOFTCAP) - 1.0)) * 1.4426950408889634
        scale = 1.0
    else:
        # The scale is applied in the exponent (one fused multiply-add per score, not a
        # multiply and a subtract): the row maximum scales with it (scale > 0).
        scale = qk_scale
    if MASKED:
        vis = k_ok[None, :] & (q_pos[:, None] - kpos[None, :] < window)
        if CAUSAL:
            vis = vis & (kpos[None, :] <= q_pos[:, None])
        else:
            vis = vis & (kpos[None, :] - q_pos[:, None] < window)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale)
        # A row that has seen nothing yet keeps m = -inf: subtract 0 instead (no NaN).
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale)
        m_use = m_new  # finite: every row saw every (finite) score of this tile
    p = tl.math.exp2(s * scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    # The rescaled accumulator is the product's accumulator (accumulated in place).
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _walk(
    q,
    m_i,
    l_i,
    acc,
    begin,
    end,
    q_pos,
    ctx,
    window,
    bt_row,
    n_pages,
    block_size,
    K,
    V,
    kv_head,
    d,
    qk_scale,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    BLOCK_N: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    PAGE_MODE: tl.constexpr,
    PAGE: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    INTERPRET: tl.constexpr,
    KV_TMA: tl.constexpr,
    SAME_STRIDES: tl.constexpr,
):
    """`_step` over the key tiles starting at ``begin, begin + BLOCK_N, ...`` below ``end``."""
    # The interpreter cannot take a tensor loop bound under numpy >= 2.4 (triton-lang/triton
    # #9171): it runs the same step in a `while` loop. On a GPU the `for` loop's loads are
    # software-pipelined (num_stages).
    if INTERPRET:
        start = begin
        while start < end:
            m_i, l_i, acc = _step(
                q, m_i, l_i, acc, start, q_pos, ctx, window, bt_row, n_pages, block_size,
                K, V, kv_head, d, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb,
                stride_vs, stride_vh, BLOCK_N, HEAD, HEAD_PAD, PAGE_MODE, PAGE, MASKED,
                CAUSAL, SOFTCAP, INTERPRET, KV_TMA, SAME_STRIDES,
            )  # fmt: skip
            start += BLOCK_N
    else:
        for start in tl.range(begin, end, BLOCK_N):
            m_i, l_i, acc = _step(
                q, m_i, l_i, acc, start, q_pos, ctx, window, bt_row, n_pages, block_size,
                K, V, kv_head, d, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb,
                stride_vs, stride_vh, BLOCK_N, HEAD, HEAD_PAD, PAGE_MODE, PAGE, MASKED,
                CAUSAL, SOFTCAP, INTERPRET, KV_TMA, SAME_STRIDES,
            )  # fmt: skip
    return m_i, l_i, acc


@triton.jit
def _tile_rows(r, t0, q_len, head, GROUP: tl.constexpr, BLOCK_Q: tl.constexpr,
               PACK_GQA: tl.constexpr):  # fmt: skip
    """For a tile's rows ``r`` (from ``t0``, the tile's first new token): each row's new
    token in its sequence, its query head (with ``PACK_GQA`` row ``r`` is token
    ``r // GROUP`` of kv head ``head``'s query head ``r % GROUP``; else every row is the
    program's ``head``) and whether the row holds a token."""
    if PACK_GQA:
        t = t0 + r // GROUP
        q_head = head * GROUP + r % GROUP
        row_ok = (r < BLOCK_Q * GROUP) & (t < q_len)
    else:
        t = t0 + r
        q_head = head
        row_ok = t < q_len
    return t, q_head, row_ok


@triton.jit
def _head_offset(q_head, stride, PACK_GQA: tl.constexpr):
    """Element offset of the rows' query heads (a column with packed heads)."""
    if PACK_GQA:
        return q_head.to(tl.int64)[:, None] * stride
    else:
        return q_head * stride


# Runtime sizes that vary between calls are not specialised on (no recompile when a cache's
# row count changes parity, say); the strides are, as Triton's loads want.
@triton.jit(do_not_specialize=["num_seqs", "block_size", "window", "cache_rows"])
def paged_prefill_kernel(
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
    num_seqs,
    block_size,
    window,
    cache_rows,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    PAGE_MODE: tl.constexpr,
    PAGE: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SKIP_DECODE_ROWS: tl.constexpr,
    INTERPRET: tl.constexpr,
    KV_TMA: tl.constexpr = False,
    SAME_STRIDES: tl.constexpr = False,
    PACK_GQA: tl.constexpr = False,
    BLOCK_Q: tl.constexpr = 0,
    SEQ_SCAN: tl.constexpr = 0,
    LATE_ROWS: tl.constexpr = False,
):
    """Paged prefill attention (the module docstring gives the formula): grid
    ``(num_heads, num_tokens // BLOCK_Q + num_seqs)``, or ``(num_kv_heads, ...)`` with
    ``PACK_GQA``: a tile's ``BLOCK_M`` rows are then ``BLOCK_Q`` tokens x the ``GROUP``
    query heads of one kv head (row ``r``: token ``r // GROUP``, head ``r % GROUP``), so
    each K/V tile serves the whole group and the causal diagonal spans ``BLOCK_Q`` tokens,
    not ``BLOCK_M``. Without it ``BLOCK_Q`` is ``BLOCK_M``. ``SEQ_SCAN`` (a power of two
    of at least ``num_seqs``, or 0): find the tile's sequence with one vector load of
    ``query_start_loc`` instead of a binary search's chain of loads."""
    tile = tl.num_programs(1) - 1 - tl.program_id(1)  # last tiles first
    # The sequence owning this tile: the last s with query_start_loc[s] // BLOCK_Q + s <= tile
    # (non-decreasing in s, so the count of such s, less one).
    if SEQ_SCAN > 0:
        s_idx = tl.arange(0, SEQ_SCAN)
        starts = tl.load(query_start_loc + s_idx, mask=s_idx < num_seqs, other=0)
        owns = (s_idx < num_seqs) & (starts // BLOCK_Q + s_idx <= tile)
        seq = tl.sum(owns.to(tl.int32), 0) - 1
    else:
        lo = tl.full([], 0, tl.int32)
        hi = tl.full([], 0, tl.int32) + num_seqs
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            below = tl.load(query_start_loc + mid) // BLOCK_Q + mid <= tile
            lo = tl.where(below, mid, lo)
            hi = tl.where(below, hi, mid)
        seq = lo
    q_begin = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_begin
    t0 = (tile - (q_begin // BLOCK_Q + seq)) * BLOCK_Q
    if t0 >= q_len:
        return
    if SKIP_DECODE_ROWS:
        if q_len == 1:
            return
    ctx = tl.load(seq_lens + seq)

    head = tl.program_id(0)  # a kv head with PACK_GQA
    kv_head = head if PACK_GQA else head // GROUP
    t, q_head, row_ok = _tile_rows(tl.arange(0, BLOCK_M), t0, q_len, head, GROUP, BLOCK_Q,
                                   PACK_GQA)  # fmt: skip
    head_off = _head_offset(q_head, stride_qh, PACK_GQA)
    out_head_off = _head_offset(q_head, stride_oh, PACK_GQA)
    d = tl.arange(0, HEAD_PAD)
    io_mask = row_ok[:, None] & (d[None, :] < HEAD)
    q_tok = (q_begin + t).to(tl.int64)
    q = tl.load(Q + q_tok[:, None] * stride_qt + head_off + d[None, :], mask=io_mask, other=0.0)
    if INTERPRET:
        q = q.to(tl.float32)
    q_pos = ctx - q_len + t
    p_first = ctx - q_len + t0
    p_last = ctx - q_len + tl.minimum(t0 + BLOCK_Q, q_len) - 1

    # Keys any row sees: [lo_key, hi_key).
    lo_key = tl.maximum(0, p_first - window + 1)
    if CAUSAL:
        hi_key = p_last + 1
        full_hi = (p_first + 1) // BLOCK_N * BLOCK_N
    else:
        hi_key = tl.minimum(ctx, p_last + window)
        full_hi = tl.minimum(ctx, p_first + window) // BLOCK_N * BLOCK_N
    # Tiles every row sees whole: [full_lo, full_hi) (possibly empty).
    begin = lo_key // BLOCK_N * BLOCK_N
    full_lo = tl.cdiv(tl.maximum(0, p_last - window + 1), BLOCK_N) * BLOCK_N
    a = tl.maximum(begin, full_lo)
    b = tl.maximum(a, full_hi)

    bt_row = block_table + seq.to(tl.int64) * stride_bt
    n_pages = tl.cdiv(ctx, block_size)
    if KV_TMA:
        # A key tile within one page per copy; columns past HEAD read zeros.
        K = tl.make_tensor_descriptor(
            K + kv_head * stride_kh,
            shape=[cache_rows, HEAD],
            strides=[stride_ks, 1],
            block_shape=[BLOCK_N, HEAD_PAD],
        )
        V = tl.make_tensor_descriptor(
            V + kv_head * stride_vh,
            shape=[cache_rows, HEAD],
            strides=[stride_vs, 1],
            block_shape=[BLOCK_N, HEAD_PAD],
        )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    # 1. cut by the window's lower edge; 2. whole; 3. the diagonal / the end.
    m_i, l_i, acc = _walk(
        q, m_i, l_i, acc, begin, tl.minimum(a, hi_key), q_pos, ctx, window, bt_row, n_pages,
        block_size, K, V, kv_head, d, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb,
        stride_vs, stride_vh, BLOCK_N, HEAD, HEAD_PAD, PAGE_MODE, PAGE, True, CAUSAL, SOFTCAP,
        INTERPRET, KV_TMA, SAME_STRIDES,
    )  # fmt: skip
    m_i, l_i, acc = _walk(
        q, m_i, l_i, acc, a, b, q_pos, ctx, window, bt_row, n_pages,
        block_size, K, V, kv_head, d, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb,
        stride_vs, stride_vh, BLOCK_N, HEAD, HEAD_PAD, PAGE_MODE, PAGE, False, CAUSAL, SOFTCAP,
        INTERPRET, KV_TMA, SAME_STRIDES,
    )  # fmt: skip
    m_i, l_i, acc = _walk(
        q, m_i, l_i, acc, b, hi_key, q_pos, ctx, window, bt_row, n_pages,
        block_size, K, V, kv_head, d, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb,
        stride_vs, stride_vh, BLOCK_N, HEAD, HEAD_PAD, PAGE_MODE, PAGE, True, CAUSAL, SOFTCAP,
        INTERPRET, KV_TMA, SAME_STRIDES,
    )  # fmt: skip
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    if LATE_ROWS:
        # The store's rows worked out again from a value the compiler cannot fold (t0 >= 0),
        # so the load's row offsets and mask are not held in registers across the key loop
        # (on sm_90 the 128-row descriptor tiles spill 392 bytes with them, 256 without).
        r = tl.arange(0, BLOCK_M) + tl.minimum(t0, 0)
        t, q_head, row_ok = _tile_rows(r, t0, q_len, head, GROUP, BLOCK_Q, PACK_GQA)
        if PACK_GQA:  # one head per program keeps its scalar offset
            out_head_off = _head_offset(q_head, stride_oh, PACK_GQA)
        q_tok = (q_begin + t).to(tl.int64)
        io_mask = row_ok[:, None] & (d[None, :] < HEAD)
    tl.store(Out + q_tok[:, None] * stride_ot + out_head_off + d[None, :],
             out.to(Out.dtype.element_ty), mask=io_mask)  # fmt: skip


def tma_ready(key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether the caches can be read through tensor descriptors: pages stored one after
    another (``[blocks * block_size, kv_heads, head]`` rows), head columns contiguous, and
    the 16-byte alignment TMA needs for each kv head's base and the row stride."""
    for c in (key_cache, value_cache):
        blocks, page, heads, head = c.shape
        item = c.element_size()
        if (
            c.stride(3) != 1
            or c.stride(0) != page * c.stride(1)
            or (c.stride(1) * item) % 16
            or (c.stride(2) * item) % 16
            or c.data_ptr() % 16
            or blocks * page >= 1 << 31
        ):
            return False
    return True


def kernel_constants(
    cfg: PrefillLaunch,
    *,
    group: int,
    head_size: int,
    block_size: int,
    num_seqs: int,
    causal: bool,
    softcap: float,
    skip_decode_rows: bool,
    interpret: bool,
    same_strides: bool,
) -> dict:
    """`paged_prefill_kernel`'s compile-time arguments for a launch configuration and a
    problem (``group``: query heads per kv head; ``same_strides``: K and V caches with the
    same strides), as `launch_prefill` passes them; `bench/prefill_registers.py` compiles
    the kernel with them for a device it need not have."""
    mode = page_mode(block_size, cfg.block_n) if cfg.page_mode is None else cfg.page_mode
    pack = cfg.pack_gqa and 1 < group <= cfg.block_m
    return dict(
        GROUP=group,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        HEAD=head_size,
        HEAD_PAD=head_pad(head_size),
        PAGE_MODE=mode,
        PAGE=block_size if mode else 1,
        CAUSAL=causal,
        SOFTCAP=softcap,
        SKIP_DECODE_ROWS=skip_decode_rows,
        INTERPRET=interpret,
        KV_TMA=cfg.kv_tma,
        SAME_STRIDES=same_strides,
        PACK_GQA=pack,
        BLOCK_Q=cfg.block_m // group if pack else cfg.block_m,
        SEQ_SCAN=SEQ_SCAN if cfg.seq_scan and 1 < num_seqs <= SEQ_SCAN else 0,
        LATE_ROWS=cfg.late_rows,
    )


def launch_prefill(
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    metadata,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    qk_scale: float,
    window: int,
    softcap: float,
    causal: bool,
    skip_decode_rows: bool,
    interpret: bool,
    kv_descriptors: bool = False,
    short_context: bool = False,
    launch: PrefillLaunch | None = None,
) -> None:
    """Launch `paged_prefill_kernel` over ``metadata``'s batch (sequences with one new
    token left alone when ``skip_decode_rows``). No host synchronisation: the grid comes
    from the metadata's host-side counts (the token and sequence counts, which the
    backend's plan key holds), so the launch is recorded and replayed by `_bound` like the
    decode kernels'. ``kv_descriptors``: the device copies tensor-descriptor tiles in
    hardware, so `prefill_launch_config` may choose them where the caches allow;
    ``short_context``: its short-context tiles (`short_context_tiles`, the caller's
    decision for the batch); ``launch`` forces a configuration (sweeps)."""
    block_size = key_cache.shape[1]
    if launch is None:
        ready = kv_descriptors and tma_ready(key_cache, value_cache)
        per_sm = float("inf")
        if ready:  # query heads x 128-row tiles per multiprocessor (the 64-row rule)
            tiles = num_heads * -(-metadata.num_tokens // 128)
            per_sm = tiles / _launch.multiprocessors(query.device.index)
        cfg = prefill_launch_config(
            head_size, query.dtype, block_size, ready, per_sm, short_context
        )
    else:
        cfg = launch
        if cfg.kv_tma and (block_size % cfg.block_n or not tma_ready(key_cache, value_cache)):
            raise ValueError(
                f"{cfg} reads key tiles through tensor descriptors, which needs a page size "
                f"that is a multiple of BLOCK_N (got {block_size}) and caches `tma_ready` "
                "accepts"
            )
    num_seqs = metadata.num_seqs
    group = num_heads // num_kv_heads
    constants = kernel_constants(
        cfg, group=group, head_size=head_size, block_size=block_size, num_seqs=num_seqs,
        causal=causal, softcap=softcap, skip_decode_rows=skip_decode_rows,
        interpret=interpret, same_strides=key_cache.stride() == value_cache.stride(),
    )  # fmt: skip
    rows = num_kv_heads if constants["PACK_GQA"] else num_heads
    grid = (rows, metadata.num_tokens // constants["BLOCK_Q"] + num_seqs)
    _bound.launch(
        paged_prefill_kernel,
        grid,
        query,
        key_cache,
        value_cache,
        out,
        metadata.query_start_loc,
        metadata.seq_lens,
        metadata.block_table,
        qk_scale,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        metadata.block_table.stride(0),
        num_seqs,
        block_size,
        window,
        key_cache.shape[0] * block_size,
        **constants,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        scratch_device=query.device if cfg.kv_tma and not interpret else None,
    )
