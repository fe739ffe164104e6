"""Mixture of experts on a Triton device: ``topk_softmax``, ``grouped_topk`` (without a
score-correction bias) and ``fused_experts``.

**Routing.** One program routes ``ROWS`` tokens: it loads their ``[ROWS, E]`` logits, takes
the softmax (or sigmoid) in fp32 and runs ``k`` rounds of argmax *on the logits* with the
op's tie rule (the lowest id among the largest untaken values wins), so the ids are the
native ids exactly; the weights are the scores at those ids, renormalized (and scaled).
``grouped_topk`` first scores the groups (the largest logit of each), keeps the
``topk_group`` best (ties to the lower group id) and runs the same argmax rounds among
their experts only, as native does (an expert at ``-inf`` in a kept group is chosen before
any expert of a dropped group). With ``e_score_correction_bias`` the order
is that of ``s + bias``, where an fp32 ``exp`` a few ULPs off torch's could swap two
near-tied experts; the provider declines those calls (they run natively).

**fused_experts** runs five launches, with no host synchronisation (every size below is a
function of the shapes, so the provider is capture-safe and its launches replay):

1. ``_count_kernel``: the ``T * k`` (token, slot) pairs in chunks of ``CHUNK``; a program
   counts its chunk's pairs per expert (a one-hot ``[CHUNK, E]`` sum, no atomics).
2. ``_scan_kernel`` (one program): per expert the total, padded up to ``BLOCK_M``; the
   exclusive prefix sums give each expert's first row in the block-aligned order and each
   chunk's first row per expert; then per block of ``BLOCK_M`` rows its expert and its
   number of real rows (``0`` for blocks past the end: the grid is sized for the most blocks
   any routing can need, ``T * k // BLOCK_M + min(E, T * k)``).
3. ``_scatter_kernel``: a pair's row is its chunk's first row for its expert plus its rank
   among the chunk's pairs of that expert (a cumulative sum), so the order within an
   expert is the pairs' order ``t * k + j`` (a stable sort: deterministic).
4. ``_gate_up_kernel``: per (block, ``BLOCK_N`` columns of ``I``) ``x[rows] @ W13[e].T``
   for the gate and the up columns (two fp32 accumulators, ``tl.dot``), ``act(g) * u``
   (with ``apply_router_weight_on_input`` the weight scales ``g`` and ``u`` first, which is
   scaling ``x``), written to the intermediate ``[T * k, I]`` in *fp32*.
5. ``_down_kernel``: ``inter[rows] @ W2[e].T`` times the routing weight, written per pair
   to ``y [T * k, H]`` in fp32; ``_sum_slots_kernel`` adds a token's ``k`` rows in slot
   order and rounds once. With top-1 ``y`` is the output itself (hidden dtype, no sum).

**Why the intermediate stays fp32.** Rounding ``act(g) * u`` to fp16/bf16 before the second
GEMM (one rounding per term of its sum) measured 5-21 ULPs of peak error against float64
on outputs of ``I`` = 32..1408, past the op's budget (``max(2 x native, 4)`` ULPs; native
measures 0.5). So the down kernel splits each fp32 tile into ``hi + lo`` in the weights'
dtype and runs two tensor-core products (``hi @ W2 + lo @ W2``): the representation error
falls to ``2**-16`` (bf16) / ``2**-22`` (fp16) relative and the peak to native's 0.5 ULP,
for twice the down GEMM's multiply work (``4/3`` of the nominal FLOPs in all) and the
intermediate's bytes doubled. fp32 inputs take IEEE fp32 products in both GEMMs.

No atomics anywhere and a fixed order of every sum, so results are deterministic; the
blocks a token shares with others change with the batch, so not batch-invariant.

Launch settings (`moe_params`), from ``m = T * k / E`` rows per expert on average, for
fp16/bf16: ``BLOCK_M = 16 if m <= 8 else 32 if m <= 64 else 64 if m <= 128 else 128``;
then per kernel (``BLOCK_N``, ``BLOCK_K``, warps, stages):

- ``BLOCK_M <= 32`` (decode: the weights stream through once): gate/up (64, 128, 4, 3),
  down (128, 64, 4, 5);
- ``BLOCK_M = 64``: gate/up (64, 64, 4, 3), down (128, 64, 4, 3);
- ``BLOCK_M = 128``: gate/up (128, 64, 8, 3), down (256, 64, 8, 3).

From a sweep on an H200 (``bench/moe.py --sweep``: Qwen3-30B-A3B and Mixtral-8x7B shapes
at 4096 tokens and at 16/64 tokens, 7 settings per kernel): at 4096 tokens 128-row blocks
with 128-column gate/up and 256-column down tiles took 1131 us (Qwen3) and 7746 us
(Mixtral) against 1236 and 8887 with the settings before (64 rows for Qwen3's ``m = 256``,
64/128-column tiles); at decode the deeper down pipeline gained up to 2 % at 16-row blocks,
and at Mixtral's 64 tokens (``m = 16``, random routing: 16 +- 4 rows an expert) one 32-row
block per expert took 719 us against 812 for 16-row blocks (828 before), as each block
reads its expert's weights. fp32 inputs keep the settings before: ``BLOCK_M = 16 if m <=
16 else 32 if m <= 64 else 64 if m <= 512 else 128``, gate/up ``BLOCK_N`` 64 and down
128, ``BLOCK_K = 32``, 8 warps at ``BLOCK_M = 128`` else 4, 2 stages (IEEE fp32 tiles are
twice the bytes). Programs are grouped ``GROUP_M = 8`` blocks at a time along the
columns, so a weight tile read from memory serves up to 8 blocks of its expert from L2.
The routing kernels take ``BLOCK_E = next_pow2(E)``, ``ROWS = min(next_pow2(T), max(1,
4096 // BLOCK_E))``; the align kernels ``CHUNK = min(next_pow2(T * k), max(16, 16384 //
BLOCK_E))`` pairs.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from opcore.kernels.triton import _bound, _launch

SILU, GELU = 0, 1
_ACTS = {"silu": SILU, "gelu": GELU}
GROUP_M = 8
MAX_EXPERTS = 1024  # the routing and align kernels hold a row of E in registers


# --------------------------------------------------------------------------- routing
@triton.jit
def _route_kernel(
    logits_ptr,
    s_row,
    s_col,
    w_ptr,
    ids_ptr,
    n_rows,
    n_experts,
    per_group,
    scale,
    N_GROUPS: tl.constexpr,
    TOPK: tl.constexpr,
    K_PAD: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    GROUPED: tl.constexpr,
    SIGMOID: tl.constexpr,
    RENORM: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_E)
    valid = (rows < n_rows)[:, None] & (cols < n_experts)[None, :]
    x = tl.load(
        logits_ptr + rows[:, None] * s_row + cols[None, :] * s_col,
        mask=valid,
        other=float("-inf"),
    ).to(tl.float32)
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        live = rows < n_rows
        m = tl.where(live, tl.max(x, axis=1), 0.0)  # rows past the end: no inf - inf
        ex = tl.where(valid, tl.exp(x - m[:, None]), 0.0)
        s = ex / tl.where(live, tl.sum(ex, axis=1), 1.0)[:, None]
    if GROUPED:
        # Group scores: the largest logit of each group (softmax and sigmoid are increasing).
        gcols = tl.arange(0, BLOCK_G)
        group_of = cols // per_group
        gscore = tl.full((ROWS, BLOCK_G), float("-inf"), tl.float32)
        for g in tl.static_range(N_GROUPS):
            in_g = valid & (group_of == g)[None, :]
            best = tl.max(tl.where(in_g, x, float("-inf")), axis=1)
            gscore = tl.where((gcols == g)[None, :], best[:, None], gscore)
        gvalid = (gcols < N_GROUPS)[None, :]
        gtaken = gvalid & (gcols < 0)[None, :]
        keep = valid & (cols < 0)[None, :]
        for _ in tl.static_range(TOPK_GROUP):
            cand = gvalid & ~gtaken
            gm = tl.where(cand, gscore, float("-inf"))
            top = tl.max(gm, axis=1)
            gid = tl.min(tl.where(cand & (gm == top[:, None]), gcols[None, :], BLOCK_G), axis=1)
            gtaken = gtaken | (gcols[None, :] == gid[:, None])
            keep = keep | (group_of[None, :] == gid[:, None])
        # Only the kept groups' experts are candidates: masking the others to -inf alone
        # would let a dropped expert of lower id win a tie against a kept one at -inf.
        pickable = valid & keep
        x = tl.where(keep, x, float("-inf"))
    else:
        pickable = valid
    kcols = tl.arange(0, K_PAD)
    taken = valid & (cols < 0)[None, :]
    wt = tl.zeros((ROWS, K_PAD), tl.float32)
    it = tl.zeros((ROWS, K_PAD), tl.int32)
    for j in tl.static_range(TOPK):
        cand = pickable & ~taken
        xm = tl.where(cand, x, float("-inf"))
        top = tl.max(xm, axis=1)
        idx = tl.min(tl.where(cand & (xm == top[:, None]), cols[None, :], BLOCK_E), axis=1)
        idx = tl.minimum(idx, n_experts - 1)  # NaN rows: some id in range, never past E
        sel = cols[None, :] == idx[:, None]
        taken = taken | sel
        wj = tl.sum(tl.where(sel & valid, s, 0.0), axis=1)
        wt = tl.where((kcols == j)[None, :], wj[:, None], wt)
        it = tl.where((kcols == j)[None, :], idx[:, None], it)
    if RENORM:
        wt = wt / tl.sum(wt, axis=1)[:, None]
    wt = wt * scale
    out = rows[:, None] * TOPK + kcols[None, :]
    omask = (rows < n_rows)[:, None] & (kcols < TOPK)[None, :]
    tl.store(w_ptr + out, wt, mask=omask)
    tl.store(ids_ptr + out, it, mask=omask)


@functools.lru_cache(maxsize=1024)
def route_params(n_rows: int, n_experts: int) -> tuple[int, int, int]:
    """``(BLOCK_E, ROWS, num_warps)``: ``BLOCK_E = next_pow2(E)``, ``ROWS =
    min(next_pow2(T), max(1, 4096 // BLOCK_E))``, one warp per 512 elements (1..8)."""
    block_e = _launch.next_pow2(n_experts)
    rows = min(_launch.next_pow2(n_rows), max(1, 4096 // block_e))
    return block_e, rows, _launch.warps_for(block_e * rows, cap=8)


def _route(logits, topk, renormalize, grouped, n_groups, topk_group, sigmoid, scale):
    n_rows, n_experts = logits.shape
    dev = logits.device
    weights = _bound.empty((n_rows, topk), torch.float32, dev)
    ids = _bound.empty((n_rows, topk), torch.int32, dev)
    if n_rows == 0:
        return weights, ids
    block_e, rows, warps = route_params(n_rows, n_experts)
    _bound.launch(
        _route_kernel,
        (_launch.cdiv(n_rows, rows),),
        logits,
        logits.stride(0),
        logits.stride(1),
        weights,
        ids,
        n_rows,
        n_experts,
        n_experts // n_groups,
        float(scale),
        N_GROUPS=n_groups,
        TOPK=topk,
        K_PAD=_launch.next_pow2(topk),
        TOPK_GROUP=topk_group,
        GROUPED=grouped,
        SIGMOID=sigmoid,
        RENORM=renormalize,
        ROWS=rows,
        BLOCK_E=block_e,
        BLOCK_G=_launch.next_pow2(n_groups),
        num_warps=warps,
    )
    return weights, ids


def topk_softmax(gating_output, topk, renormalize):
    """`topk_softmax` on a Triton device (module docstring): the native ids exactly."""
    return _route(gating_output, topk, renormalize, False, 1, 1, False, 1.0)


def grouped_topk(
    gating_output,
    topk,
    renormalize,
    num_expert_group,
    topk_group,
    scoring_func="softmax",
    routed_scaling_factor=1.0,
    e_score_correction_bias=None,
):
    """`grouped_topk` on a Triton device, without a score-correction bias (the provider's
    ``supports_args`` sends calls with one to the next provider)."""
    if e_score_correction_bias is not None:
        raise ValueError("grouped_topk (triton): e_score_correction_bias is not supported")
    return _route(
        gating_output,
        topk,
        renormalize,
        True,
        num_expert_group,
        topk_group,
        scoring_func == "sigmoid",
        routed_scaling_factor,
    )


# --------------------------------------------------------------------------- block-aligned sort
@triton.jit
def _count_kernel(
    ids_ptr,
    s_tok,
    s_slot,
    counts_ptr,
    n_pairs,
    TOPK: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    pairs = c * CHUNK + tl.arange(0, CHUNK)
    experts = tl.arange(0, BLOCK_E)
    e = tl.load(
        ids_ptr + (pairs // TOPK) * s_tok + (pairs % TOPK) * s_slot, mask=pairs < n_pairs, other=-1
    )
    hot = (e[:, None] == experts[None, :]).to(tl.int32)
    tl.store(counts_ptr + c * BLOCK_E + experts, tl.sum(hot, axis=0))


@triton.jit
def _scan_kernel(
    counts_ptr,
    offsets_ptr,
    meta_ptr,
    n_chunks,
    max_blocks,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    CB: tl.constexpr,
    BB: tl.constexpr,
):
    experts = tl.arange(0, BLOCK_E)
    total = tl.zeros((BLOCK_E,), tl.int32)
    # while loops: the trip counts follow the token count (Triton's interpreter cannot
    # run a for loop to a runtime bound here, and these loops need no pipelining).
    c0 = 0
    while c0 < n_chunks:
        cs = c0 + tl.arange(0, CB)
        tile = tl.load(
            counts_ptr + cs[:, None] * BLOCK_E + experts[None, :],
            mask=(cs < n_chunks)[:, None],
            other=0,
        )
        total += tl.sum(tile, axis=0)
        c0 += CB
    blocks = (total + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(blocks, axis=0)
    block_start = block_end - blocks
    running = block_start * BLOCK_M
    c0 = 0
    while c0 < n_chunks:
        cs = c0 + tl.arange(0, CB)
        cmask = (cs < n_chunks)[:, None]
        at = cs[:, None] * BLOCK_E + experts[None, :]
        tile = tl.load(counts_ptr + at, mask=cmask, other=0)
        tl.store(offsets_ptr + at, running[None, :] + tl.cumsum(tile, axis=0) - tile, mask=cmask)
        running += tl.sum(tile, axis=0)
        c0 += CB
    # meta[0, b]: block b's expert (-1 past the end); meta[1, b]: its real rows (0 past it).
    b0 = 0
    while b0 < max_blocks:
        bs = b0 + tl.arange(0, BB)
        e_of = tl.sum((block_end[None, :] <= bs[:, None]).to(tl.int32), axis=1)
        hot = experts[None, :] == e_of[:, None]
        left = tl.sum(
            tl.where(hot, total[None, :] - (bs[:, None] - block_start[None, :]) * BLOCK_M, 0),
            axis=1,
        )
        live = e_of < BLOCK_E
        tl.store(meta_ptr + bs, tl.where(live, e_of, -1), mask=bs < max_blocks)
        tl.store(
            meta_ptr + max_blocks + bs,
            tl.where(live, tl.minimum(left, BLOCK_M), 0),
            mask=bs < max_blocks,
        )
        b0 += BB


@triton.jit
def _scatter_kernel(
    ids_ptr,
    s_tok,
    s_slot,
    offsets_ptr,
    sorted_ptr,
    n_pairs,
    n_experts,
    TOPK: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    pairs = c * CHUNK + tl.arange(0, CHUNK)
    experts = tl.arange(0, BLOCK_E)
    live = pairs < n_pairs
    e = tl.load(ids_ptr + (pairs // TOPK) * s_tok + (pairs % TOPK) * s_slot, mask=live, other=-1)
    hot = (e[:, None] == experts[None, :]).to(tl.int32)
    rank = tl.cumsum(hot, axis=0) - hot
    base = tl.load(offsets_ptr + c * BLOCK_E + experts)
    pos = tl.sum(hot * (rank + base[None, :]), axis=1)
    ok = live & (e >= 0) & (e < n_experts)
    tl.store(sorted_ptr + pos, pairs.to(tl.int32), mask=ok)


INTERPRETED = type(_count_kernel).__name__ == "InterpretedFunction"


def max_blocks_for(n_pairs: int, n_experts: int, block_m: int) -> int:
    """The most ``BLOCK_M`` blocks any routing of ``n_pairs`` pairs over ``n_experts`` needs:
    ``n_pairs // BLOCK_M + min(E, n_pairs)`` (each expert's count, rounded up)."""
    return n_pairs // block_m + min(n_experts, n_pairs)


@functools.lru_cache(maxsize=1024)
def align_params(n_pairs: int, n_experts: int) -> tuple[int, int, int, int]:
    """``(BLOCK_E, CHUNK, CB, num_warps)`` of the align kernels (module docstring)."""
    block_e = _launch.next_pow2(n_experts)
    chunk = min(_launch.next_pow2(n_pairs), max(16, 16384 // block_e))
    n_chunks = _launch.cdiv(n_pairs, chunk)
    cb = min(_launch.next_pow2(n_chunks), max(1, 8192 // block_e))
    return block_e, chunk, cb, _launch.warps_for(chunk * block_e, per_warp=1024, cap=8)


def align_block_size(topk_ids: torch.Tensor, n_experts: int, block_m: int):
    """``(sorted_pairs [max_blocks * BLOCK_M] int32, meta [2, max_blocks] int32)``: the pairs
    ``t * k + j`` grouped by expert, each expert's run padded to a multiple of ``block_m``
    (pad entries unspecified), and per block its expert (``-1`` past the end) and real row
    count (``0`` past the end). Three launches, no host synchronisation."""
    n_tokens, k = topk_ids.shape
    n_pairs = n_tokens * k
    dev = topk_ids.device
    block_e, chunk, cb, warps = align_params(n_pairs, n_experts)
    n_chunks = _launch.cdiv(n_pairs, chunk)
    max_blocks = max_blocks_for(n_pairs, n_experts, block_m)
    counts = _bound.empty((n_chunks, block_e), torch.int32, dev)
    offsets = _bound.empty((n_chunks, block_e), torch.int32, dev)
    meta = _bound.empty((2, max_blocks), torch.int32, dev)
    sorted_pairs = _bound.empty((max_blocks * block_m,), torch.int32, dev)
    s_tok, s_slot = topk_ids.stride()
    _bound.launch(
        _count_kernel,
        (n_chunks,),
        topk_ids,
        s_tok,
        s_slot,
        counts,
        n_pairs,
        TOPK=k,
        CHUNK=chunk,
        BLOCK_E=block_e,
        num_warps=warps,
    )
    bb = min(_launch.next_pow2(max_blocks), max(1, 8192 // block_e))
    _bound.launch(
        _scan_kernel,
        (1,),
        counts,
        offsets,
        meta,
        n_chunks,
        max_blocks,
        BLOCK_M=block_m,
        BLOCK_E=block_e,
        CB=cb,
        BB=bb,
        num_warps=_launch.warps_for(cb * block_e, cap=8),
    )
    _bound.launch(
        _scatter_kernel,
        (n_chunks,),
        topk_ids,
        s_tok,
        s_slot,
        offsets,
        sorted_pairs,
        n_pairs,
        n_experts,
        TOPK=k,
        CHUNK=chunk,
        BLOCK_E=block_e,
        num_warps=warps,
    )
    return sorted_pairs, meta


# --------------------------------------------------------------------------- grouped GEMMs
@triton.jit
def _tile(pid, max_blocks, n_cols, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """Program ``pid`` -> (block, column tile), ``GROUP`` blocks walking the columns together."""
    n_tiles = tl.cdiv(n_cols, BLOCK_N)
    per_group = GROUP * n_tiles
    first = (pid // per_group) * GROUP
    size = tl.minimum(max_blocks - first, GROUP)
    b = first + (pid % per_group) % size
    nt = (pid % per_group) // size
    return b, nt


@triton.jit
def _gate_up_kernel(
    x_ptr,
    sx_t,
    sx_h,
    w_ptr,
    sw_e,
    sw_n,
    sw_k,
    tw_ptr,
    stw_t,
    stw_j,
    sorted_ptr,
    meta_ptr,
    inter_ptr,
    max_blocks,
    hidden: tl.constexpr,
    n_inter: tl.constexpr,
    TOPK: tl.constexpr,
    ACT: tl.constexpr,
    WEIGHT_IN: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
):
    b, nt = _tile(tl.program_id(0), max_blocks, n_inter, BLOCK_N, GROUP)
    n_real = tl.load(meta_ptr + max_blocks + b)
    if n_real > 0:
        e = tl.load(meta_ptr + b).to(tl.int64)
        r = tl.arange(0, BLOCK_M)
        rmask = r < n_real
        pair = tl.load(sorted_ptr + b * BLOCK_M + r, mask=rmask, other=0).to(tl.int64)
        tok = pair // TOPK
        n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < n_inter
        a_rows = x_ptr + tok[:, None] * sx_t
        w_g = w_ptr + e * sw_e + n[None, :] * sw_n
        w_u = w_g + n_inter * sw_n
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            kmask = kk < hidden
            a = tl.load(
                a_rows + kk[None, :] * sx_h, mask=rmask[:, None] & kmask[None, :], other=0.0
            )
            wmask = kmask[:, None] & nmask[None, :]
            bg = tl.load(w_g + kk[:, None] * sw_k, mask=wmask, other=0.0)
            bu = tl.load(w_u + kk[:, None] * sw_k, mask=wmask, other=0.0)
            if UPCAST:  # Triton's interpreter multiplies bf16 tiles wrongly: in fp32
                a, bg, bu = a.to(tl.float32), bg.to(tl.float32), bu.to(tl.float32)
            if IEEE:
                acc_g = tl.dot(a, bg, acc_g, input_precision="ieee")
                acc_u = tl.dot(a, bu, acc_u, input_precision="ieee")
            else:
                acc_g = tl.dot(a, bg, acc_g)
                acc_u = tl.dot(a, bu, acc_u)
        if WEIGHT_IN:  # (w * x) @ W == w * (x @ W): scale the input of the activation
            wt = tl.load(tw_ptr + tok * stw_t + (pair % TOPK) * stw_j, mask=rmask, other=0.0)
            acc_g = acc_g * wt.to(tl.float32)[:, None]
            acc_u = acc_u * wt.to(tl.float32)[:, None]
        if ACT == 0:
            h = acc_g * tl.sigmoid(acc_g) * acc_u
        else:
            h = 0.5 * acc_g * (1.0 + tl.erf(acc_g * 0.7071067811865476)) * acc_u
        tl.store(
            inter_ptr + pair[:, None] * n_inter + n[None, :],
            h.to(inter_ptr.dtype.element_ty),
            mask=rmask[:, None] & nmask[None, :],
        )


@triton.jit
def _down_kernel(
    inter_ptr,
    w_ptr,
    sw_e,
    sw_n,
    sw_k,
    tw_ptr,
    stw_t,
    stw_j,
    sorted_ptr,
    meta_ptr,
    y_ptr,
    max_blocks,
    hidden: tl.constexpr,
    n_inter: tl.constexpr,
    TOPK: tl.constexpr,
    WEIGHT_OUT: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
):
    b, nt = _tile(tl.program_id(0), max_blocks, hidden, BLOCK_N, GROUP)
    n_real = tl.load(meta_ptr + max_blocks + b)
    if n_real > 0:
        e = tl.load(meta_ptr + b).to(tl.int64)
        r = tl.arange(0, BLOCK_M)
        rmask = r < n_real
        pair = tl.load(sorted_ptr + b * BLOCK_M + r, mask=rmask, other=0).to(tl.int64)
        n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < hidden
        a_rows = inter_ptr + pair[:, None] * n_inter
        w_cols = w_ptr + e * sw_e + n[None, :] * sw_n
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, n_inter, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            kmask = kk < n_inter
            a = tl.load(a_rows + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
            bw = tl.load(
                w_cols + kk[:, None] * sw_k, mask=kmask[:, None] & nmask[None, :], other=0.0
            )
            if IEEE:
                acc = tl.dot(a, bw, acc, input_precision="ieee")
            else:
                # The fp32 intermediate as hi + lo in the weights' dtype: two tensor-core
                # products carry it to about 16 (bf16) / 22 (fp16) bits, not 8 / 11.
                hi = a.to(bw.dtype)
                lo = (a - hi.to(tl.float32)).to(bw.dtype)
                if UPCAST:  # Triton's interpreter multiplies bf16 tiles wrongly: in fp32
                    hi, lo, bw = hi.to(tl.float32), lo.to(tl.float32), bw.to(tl.float32)
                acc = tl.dot(hi, bw, acc)
                acc = tl.dot(lo, bw, acc)
        if WEIGHT_OUT:
            tok = pair // TOPK
            wt = tl.load(tw_ptr + tok * stw_t + (pair % TOPK) * stw_j, mask=rmask, other=0.0)
            acc = acc * wt.to(tl.float32)[:, None]
        tl.store(
            y_ptr + pair[:, None] * hidden + n[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=rmask[:, None] & nmask[None, :],
        )


@triton.jit
def _sum_slots_kernel(
    y_ptr,
    out_ptr,
    n_tokens,
    hidden,
    TOPK: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < n_tokens)[:, None] & (cols < hidden)[None, :]
    acc = tl.zeros((ROWS, BLOCK_C), tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(
            y_ptr + (rows * TOPK + j)[:, None] * hidden + cols[None, :], mask=mask, other=0.0
        )
    tl.store(
        out_ptr + rows[:, None] * hidden + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=mask,
    )


def _kernel(block_n: int, block_k: int, warps: int, stages: int) -> dict:
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": warps, "num_stages": stages}


@functools.lru_cache(maxsize=1024)
def moe_params(n_pairs: int, n_experts: int, fp32: bool) -> dict:
    """Launch settings of the two grouped GEMMs (the module docstring gives the rule and
    where it was measured): ``{"BLOCK_M": int, "gate_up": {...}, "down": {...}}``, each
    kernel's dict holding its ``BLOCK_N``, ``BLOCK_K``, ``num_warps`` and ``num_stages``."""
    m = n_pairs / n_experts
    if fp32:  # IEEE fp32 tiles: twice the bytes, half the K tile, two stages
        block_m = 16 if m <= 16 else 32 if m <= 64 else 64 if m <= 512 else 128
        warps = 8 if block_m == 128 else 4
        return {
            "BLOCK_M": block_m,
            "gate_up": _kernel(64, 32, warps, 2),
            "down": _kernel(128, 32, warps, 2),
        }
    block_m = 16 if m <= 8 else 32 if m <= 64 else 64 if m <= 128 else 128
    if block_m <= 32:  # weights streamed: long K tiles, deep pipeline on the down GEMM
        return {
            "BLOCK_M": block_m,
            "gate_up": _kernel(64, 128, 4, 3),
            "down": _kernel(128, 64, 4, 5),
        }
    if block_m == 64:
        return {"BLOCK_M": 64, "gate_up": _kernel(64, 64, 4, 3), "down": _kernel(128, 64, 4, 3)}
    return {"BLOCK_M": 128, "gate_up": _kernel(128, 64, 8, 3), "down": _kernel(256, 64, 8, 3)}


def fused_experts(
    hidden_states,
    w13,
    w2,
    topk_weights,
    topk_ids,
    activation="silu",
    apply_router_weight_on_input=False,
):
    """`fused_experts` on a Triton device (module docstring): align, two grouped GEMMs,
    the slot sum; ``[T, H]`` in the hidden dtype."""
    x = hidden_states
    n_tokens, hidden = x.shape
    n_experts, n_inter = w13.shape[0], w2.shape[2]
    k = topk_ids.shape[1]
    dev, dtype = x.device, x.dtype
    n_pairs = n_tokens * k
    if n_tokens == 0:
        return _bound.empty((0, hidden), dtype, dev)
    p = moe_params(n_pairs, n_experts, dtype == torch.float32)
    bm = p["BLOCK_M"]
    ieee = dtype == torch.float32
    sorted_pairs, meta = align_block_size(topk_ids, n_experts, bm)
    max_blocks = meta.shape[1]
    inter = _bound.empty((n_pairs, n_inter), torch.float32, dev)
    gate_up = p["gate_up"]
    _bound.launch(
        _gate_up_kernel,
        (max_blocks * _launch.cdiv(n_inter, gate_up["BLOCK_N"]),),
        x,
        x.stride(0),
        x.stride(1),
        w13,
        w13.stride(0),
        w13.stride(1),
        w13.stride(2),
        topk_weights,
        topk_weights.stride(0),
        topk_weights.stride(1),
        sorted_pairs,
        meta,
        inter,
        max_blocks,
        hidden=hidden,
        n_inter=n_inter,
        TOPK=k,
        ACT=_ACTS[activation],
        WEIGHT_IN=apply_router_weight_on_input,
        IEEE=ieee,
        UPCAST=INTERPRETED,
        BLOCK_M=bm,
        GROUP=GROUP_M,
        **gate_up,
    )
    y = _bound.empty((n_pairs, hidden), dtype if k == 1 else torch.float32, dev)
    down = p["down"]
    _bound.launch(
        _down_kernel,
        (max_blocks * _launch.cdiv(hidden, down["BLOCK_N"]),),
        inter,
        w2,
        w2.stride(0),
        w2.stride(1),
        w2.stride(2),
        topk_weights,
        topk_weights.stride(0),
        topk_weights.stride(1),
        sorted_pairs,
        meta,
        y,
        max_blocks,
        hidden=hidden,
        n_inter=n_inter,
        TOPK=k,
        WEIGHT_OUT=not apply_router_weight_on_input,
        IEEE=ieee,
        UPCAST=INTERPRETED,
        BLOCK_M=bm,
        GROUP=GROUP_M,
        **down,
    )
    if k == 1:
        return y  # one row per token: y is the output
    out = _bound.empty((n_tokens, hidden), dtype, dev)
    block_c, rows, warps = _launch.elementwise_params(n_tokens, hidden)
    _bound.launch(
        _sum_slots_kernel,
        (_launch.cdiv(n_tokens, rows), _launch.cdiv(hidden, block_c)),
        y,
        out,
        n_tokens,
        hidden,
        TOPK=k,
        ROWS=rows,
        BLOCK_C=block_c,
        num_warps=warps,
    )
    return out
