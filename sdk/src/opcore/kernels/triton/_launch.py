"""Launch parameters chosen from the problem shape (no autotuning on the hot path).

Every function here is a pure, cached function of a few integers, so a launcher pays a
dictionary lookup, not a search, per call. The rules follow the row-kernel practice of
memory-bound kernels: one row per program when rows are long, several rows per program
when they are short, and smaller tiles when there are too few rows to fill the device.
"""

from __future__ import annotations

import functools

# Programs wanted in flight before tiles are made larger; about two per multiprocessor on
# current datacentre GPUs. A fixed number keeps the choice a function of shape alone.
MIN_PROGRAMS = 256

# Largest row held in registers by the norm kernels; longer rows loop over chunks.
MAX_FUSED_COLS = 16384
CHUNK_COLS = 4096


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def warps_for(elements: int, per_warp: int = 512, cap: int = 16) -> int:
    """Warps for a tile of ``elements``: a power of two (Triton's layouts need one) near
    ``elements / per_warp`` (rounded down), 1..cap."""
    n = max(1, min(cap, elements // per_warp))
    return 1 << (n.bit_length() - 1)


@functools.lru_cache(maxsize=4096)
def row_params(n_rows: int, n_cols: int) -> tuple[int, int, bool, int]:
    """``(BLOCK_N, ROWS, SINGLE_PASS, num_warps)`` for a row-reduction kernel."""
    if n_cols > MAX_FUSED_COLS:
        return CHUNK_COLS, 1, False, warps_for(CHUNK_COLS)
    block_n = next_pow2(n_cols)
    rows = 1
    if block_n <= 1024:
        rows = min(4096 // block_n, next_pow2(n_rows))
        while rows > 1 and cdiv(n_rows, rows) < MIN_PROGRAMS:
            rows //= 2
    # About 16 elements per thread. (8 warps for rows of 8192 was tried on the H200: no gain
    # at 32k rows, and 1-32 token rows got 10-20 % slower than with 16.)
    return block_n, rows, True, warps_for(block_n * rows)


# Smallest column tile worth choosing for divisibility; a width whose largest power-of-two
# divisor is smaller keeps the plain tile and one partly masked tile per row.
MIN_EVEN_TILE = 512


def even_tile(n_cols: int, tile: int) -> int:
    """Column tile for a row of ``n_cols`` split into tiles of at most ``tile`` (a power of two).

    A row that fits in one tile gets ``next_pow2(n_cols)``. A longer row gets the largest
    power of two ``<= tile`` that divides ``n_cols`` (14336 -> 2048), so no program of the
    row runs half masked; if that is below `MIN_EVEN_TILE` (11008 -> 256), ``tile``.
    """
    if n_cols <= tile:
        return next_pow2(n_cols)
    even = min(tile, n_cols & -n_cols)  # n & -n: the largest power of two dividing n
    return even if even >= MIN_EVEN_TILE else tile


@functools.lru_cache(maxsize=4096)
def elementwise_params(n_rows: int, n_cols: int) -> tuple[int, int, int]:
    """``(BLOCK_C, ROWS, num_warps)`` for a row-wise elementwise kernel on a ``[rows, cols]``
    output.

    A program covers about ``tile`` elements: ``ROWS`` rows of a ``BLOCK_C`` column tile
    (see `even_tile`), with one warp per 256 elements (at most 8).
    """
    tile = 4096
    while tile > MIN_EVEN_TILE and cdiv(n_rows * n_cols, tile) < 4 * MIN_PROGRAMS:
        tile //= 2
    block_c = even_tile(n_cols, tile)
    rows = max(1, min(tile // block_c, next_pow2(n_rows)))
    return block_c, rows, warps_for(block_c * rows, per_warp=256, cap=8)


@functools.lru_cache(maxsize=4096)
def token_head_params(
    n_tokens: int, n_a: int, n_b: int, head_cols: int
) -> tuple[int, int, int, int]:
    """``(PROGRAMS, BLOCK_A, BLOCK_B, num_warps)`` for kernels over the heads of one token.

    A token's two head groups (q and k; ``n_b`` may be 0) are shared by ``PROGRAMS``
    programs (the grid's second dimension): program ``s`` takes heads ``[s * BLOCK_A,
    (s + 1) * BLOCK_A)`` of the first group and ``[s * BLOCK_B, (s + 1) * BLOCK_B)`` of the
    second, so it loads the token's cos/sin row once for all of them. With enough tokens
    (``4 * MIN_PROGRAMS``) that is one program per token; with fewer, the groups are split
    in powers of two (down to one head of the smaller group per program) until there are
    about that many programs. ``head_cols`` is the padded number of columns per head.
    """
    smaller = min(n_a, n_b) if n_b else n_a
    splits = 1
    while n_tokens * splits < 4 * MIN_PROGRAMS and 2 * splits <= smaller:
        splits *= 2
    programs, block_a, block_b = head_split(n_a, n_b, splits)
    return (
        programs,
        block_a,
        block_b,
        warps_for((block_a + block_b) * head_cols, per_warp=256, cap=8),
    )


def max_head_splits(n_a: int, n_b: int) -> int:
    """The most programs a token's heads may be split over: the smaller group's count."""
    return max(1, min(n_a, n_b) if n_b else n_a)


def head_split(n_a: int, n_b: int, splits: int) -> tuple[int, int, int]:
    """``(PROGRAMS, BLOCK_A, BLOCK_B)`` when a token's two head groups are split ``splits``
    ways (``1 <= splits <= max_head_splits``): each program takes ``BLOCK_A`` heads of the
    first group and ``BLOCK_B`` of the second."""
    block_a = next_pow2(cdiv(n_a, splits))
    block_b = next_pow2(cdiv(n_b, splits)) if n_b else 1
    return max(cdiv(n_a, block_a), cdiv(n_b, block_b)), block_a, block_b


@functools.lru_cache(maxsize=4096)
def split_qkv_params(
    n_tokens: int, n_q: int, n_kv: int, head_cols: int
) -> tuple[int, int, int, int]:
    """`token_head_params` for the fused split kernel, with fewer warps once there is one
    program per token: about 2048 elements per warp, at least 2. Measured on an H200 at
    32k bf16 tokens (``bench/sweep_split_qkv.py``; results in
    ``bench/results/2026-11-29-h200-split-sweep/``): 32/8 heads x 128 reach 90 % of copy
    bandwidth on 2 warps against 78.5 % on 8; 64/8 reach 87.5 % on 4 against 82 % on 8.
    With fewer tokens (split heads, latency-bound) the general rule stays."""
    programs, block_q, block_kv, warps = token_head_params(n_tokens, n_q, n_kv, head_cols)
    if programs == 1 and n_tokens >= 4 * MIN_PROGRAMS:
        warps = max(2, warps_for((block_q + block_kv) * head_cols, per_warp=2048, cap=8))
    return programs, block_q, block_kv, warps
