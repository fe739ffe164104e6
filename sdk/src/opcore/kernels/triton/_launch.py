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
    """Warps for a tile of ``elements``: about 16 elements per thread, 1..cap warps."""
    return max(1, min(cap, elements // per_warp))


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
    return block_n, rows, True, warps_for(block_n * rows)


@functools.lru_cache(maxsize=4096)
def elementwise_params(n_rows: int, n_cols: int) -> tuple[int, int, int]:
    """``(BLOCK_C, ROWS, num_warps)`` for a row-wise elementwise kernel on a ``[rows, cols]`` output."""
    tile = 4096
    while tile > 512 and cdiv(n_rows * n_cols, tile) < 4 * MIN_PROGRAMS:
        tile //= 2
    block_c = min(next_pow2(n_cols), tile)
    rows = max(1, min(tile // block_c, next_pow2(n_rows)))
    return block_c, rows, warps_for(block_c * rows, per_warp=256, cap=8)


@functools.lru_cache(maxsize=4096)
def head_params(n_tokens: int, max_heads: int, min_heads: int, head_cols: int) -> tuple[int, int]:
    """``(BLOCK_H, num_warps)`` for kernels that process heads of one token per program.

    ``head_cols`` is the padded number of columns touched per head. Few tokens: small
    head blocks so the heads of one token spread over many programs. Many tokens: larger
    blocks (one cos/sin load serves more heads), capped by the smallest head group so a
    block does not run mostly masked.
    """
    target = 2048 if n_tokens * max_heads >= 4 * MIN_PROGRAMS else 256
    block_h = max(1, min(next_pow2(max(1, target // head_cols)), next_pow2(max(1, min_heads))))
    return block_h, warps_for(block_h * head_cols, per_warp=256, cap=8)
