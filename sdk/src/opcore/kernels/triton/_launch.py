"""Launch parameters chosen from the problem shape and the device's figures (no autotuning
on the hot path): the launch model used wherever the tuning table has no entry.

Every function here is a pure, cached function of a few integers, so a launcher pays a
dictionary lookup, not a search, per call. The rules follow the row-kernel practice of
memory-bound kernels, with the device figures they depend on read from Triton's driver:
the multiprocessor count ``sms`` (`multiprocessors`), and for the norm's load order the
register file (`norm_resident_warps`):

- **Few rows** (at most ``LATENCY_ROWS_PER_SM * sms``): every program starts at once and
  the call lasts about one memory round trip, so a program takes one row (norms) or one
  1024-element span (gated activations) and spreads it over many warps (norms: about 16
  elements per thread, 8 while that leaves fewer than 4 warps, the weight loaded with the
  row while every program fits on the device at once; activations: 4): one memory round
  trip, the fewest instructions before the loads.
- **Many rows**: programs queue up, so each does more work per launch slot: norms about
  16 elements per thread, several short rows per program while at least
  ``2 * sms`` programs remain; gated activations a 2048-element tile walked columns first
  (consecutive programs touch neighbouring memory, as a flattened pointwise loop does).

The constants were fitted to `bench/sweep_launch.py`'s timings of every configuration over
hidden sizes 1024-5120 (rms_norm) and intermediates 4864-18432 (silu_and_mul) at 1-16384
tokens on the H200 (``bench/results/2026-12-02-h200-session2/``), and over the head
layouts of three model families at 1-16384 tokens on an H100 (rotary and the fused split,
``bench/results/2026-12-06-h100-launch/``); docs/tuning.md says how a vendor refits them.
"""

from __future__ import annotations

import functools
import logging
import os

logger = logging.getLogger(__name__)

# Programs wanted in flight before tiles are made larger: two per multiprocessor. The
# module default is the figure of the device the rules were fitted on (132
# multiprocessors); launchers pass their device's own count.
PROGRAMS_PER_SM = 2
REFERENCE_SMS = 132
# The fixed count the kernels not yet fitted (quant's groups and its ungated tiles, MoE's
# elementwise steps) still size their grids by.
MIN_PROGRAMS = 256
# At most this many rows per multiprocessor is the latency-bound regime.
LATENCY_ROWS_PER_SM = 4
# The fitted device's register file: registers a multiprocessor holds, threads a warp.
REFERENCE_REGISTERS = 65536
REFERENCE_WARP_SIZE = 32
# Registers a thread of the norm kernel at about 16 row elements a thread, as launches
# compile it for sm_90 (bench/launch_registers.py over the wide grid of real-model shapes,
# 2026-12-07): with the weight loaded first, 26-40 on 4-16 warps where a row's loads are
# 16-byte vectors of 16-bit elements (`norm_vector_loads`; 42 on 32 warps, one program a
# multiprocessor either way), 31-52 in fp32, and up to 64 where the loads are scalar.
NORM_REGISTERS_VECTOR = 40
NORM_REGISTERS = 64
# Warps of the norm kernel the fitted device's multiprocessor holds at once on scalar loads.
NORM_RESIDENT_WARPS_PER_SM = REFERENCE_REGISTERS // (NORM_REGISTERS * REFERENCE_WARP_SIZE)

# Largest row held in registers by the norm kernels; longer rows loop over chunks.
MAX_FUSED_COLS = 16384
CHUNK_COLS = 4096


@functools.cache
def _driver_properties(device_index: int | None) -> tuple[dict, str]:
    """``(properties, "")`` of the active Triton driver's device ``device_index`` (its
    current device when ``None``), or ``({}, why)`` where the driver cannot say."""
    try:
        from triton.runtime import driver

        active = driver.active
        index = active.get_current_device() if device_index is None else device_index
        return dict(active.utils.get_device_properties(index)), ""
    except Exception as why:  # a driver without the query
        return {}, f"{type(why).__name__}: {why}"


def _figure(device_index: int | None, what: str, keys: tuple[str, ...], reference: tuple):
    """The driver's positive integers ``keys`` for the device, or ``reference`` (with one
    warning, naming ``what``) under Triton's interpreter or where the driver reports none:
    the launches stay correct, only their sizing is the fitted device's."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return reference
    props, reason = _driver_properties(device_index)
    values = tuple(int(props.get(k) or 0) for k in keys)
    if all(v > 0 for v in values):
        return values
    logger.warning(
        "opcore triton launch model: no %s for device %s from Triton's driver (%s); sizing "
        "launches for the fitted device's %s",
        what,
        device_index,
        reason or "it reports none",
        " x ".join(map(str, reference)),
    )
    return reference


@functools.cache
def multiprocessors(device_index: int | None = None) -> int:
    """The multiprocessor count of the active Triton driver's device ``device_index``
    (its current device when ``None``); `REFERENCE_SMS` under Triton's interpreter or where
    the driver does not report one (said once per device)."""
    return _figure(
        device_index, "multiprocessor count", ("multiprocessor_count",), (REFERENCE_SMS,)
    )[0]


@functools.cache
def register_file(device_index: int | None = None) -> tuple[int, int]:
    """``(registers, warp size)`` of the active Triton driver's device ``device_index``:
    the driver's ``max_num_regs`` (a block's share of the register file, which is a
    multiprocessor's whole file on NVIDIA GPUs since sm_50) and ``warpSize``; the fitted
    device's under Triton's interpreter or where the driver reports none (said once per
    device)."""
    return _figure(
        device_index,
        "register file",
        ("max_num_regs", "warpSize"),
        (REFERENCE_REGISTERS, REFERENCE_WARP_SIZE),
    )


@functools.cache
def norm_resident_warps(device_index: int | None = None, vector_loads: bool = False) -> int:
    """Warps of the norm kernel one multiprocessor of device ``device_index`` holds at once:
    its `register_file` over the kernel's registers a warp (`NORM_REGISTERS_VECTOR` a
    thread with ``vector_loads``, else `NORM_REGISTERS`)."""
    registers, warp = register_file(device_index)
    return registers // ((NORM_REGISTERS_VECTOR if vector_loads else NORM_REGISTERS) * warp)


def norm_vector_loads(element_size: int, *sizes: int) -> bool:
    """Whether the norm kernel's row loads compile to 16-byte vectors: 16-bit elements, and
    the row length and strides ``sizes`` multiples of 16 (Triton specialises such integers
    and then proves the loads aligned). Elsewhere the loads are scalar and the kernel takes
    more registers (`NORM_REGISTERS`)."""
    if element_size != 2:
        return False
    bits = 0
    for v in sizes:  # a multiple of 16 has its low four bits clear
        bits |= v
    return bits % 16 == 0


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def warps_for(elements: int, per_warp: int = 512, cap: int = 16) -> int:
    """Warps for a tile of ``elements``: a power of two (Triton's layouts need one) near
    ``elements / per_warp`` (rounded down), 1..cap."""
    n = max(1, min(cap, elements // per_warp))
    return 1 << (n.bit_length() - 1)


def few_rows(n_rows: int, sms: int = REFERENCE_SMS) -> bool:
    """Whether ``n_rows`` rows are the latency-bound regime on ``sms`` multiprocessors."""
    return n_rows <= LATENCY_ROWS_PER_SM * sms


def norm_weight_first(
    n_rows: int,
    rows: int,
    warps: int,
    sms: int = REFERENCE_SMS,
    resident_warps: int = NORM_RESIDENT_WARPS_PER_SM,
) -> bool:
    """Whether the norm kernel loads the weight before the row's reduction (its
    ``WEIGHT_FIRST``), for ``n_rows`` rows launched ``rows`` a program on ``warps`` warps,
    on ``sms`` multiprocessors that each hold ``resident_warps`` of the kernel's warps
    (`norm_resident_warps`).

    With few rows a call is one memory round trip, and a weight loaded after the
    reduction's barrier makes it two; so the weight comes first while every program is
    resident at once: whole programs, ``resident_warps // warps`` a multiprocessor. Past
    that the programs run in waves, the next wave's loads hide the barrier, and the first
    order lost: 5-10 % at 512 x 7168 (16 warps a row: more than three rows a
    multiprocessor) where at 512 x 2048-4096 (4-8 warps: one wave) it won 1-5 %
    (bench/norm_decode.py, H100, 2026-12-07), and at 384 x 5120-8192 (three rows a
    multiprocessor) it won 1.1-3.1 % for ``rms_norm`` and was level for
    ``fused_add_rms_norm``. With many rows the weight held through the reduction costs
    registers too (98 % of copy against 95 % at 4096 x 4096 on an H100, 2026-12-06); at
    1024-4096 rows it ran from 3 % faster to 6.5 % slower (the run of 2026-12-07)."""
    programs = cdiv(n_rows, rows)
    return few_rows(n_rows, sms) and programs <= (resident_warps // warps) * sms


@functools.lru_cache(maxsize=4096)
def row_params(n_rows: int, n_cols: int, sms: int = REFERENCE_SMS) -> tuple[int, int, bool, int]:
    """``(BLOCK_N, ROWS, SINGLE_PASS, num_warps)`` for a row-reduction kernel on a device
    of ``sms`` multiprocessors."""
    if n_cols > MAX_FUSED_COLS:
        return CHUNK_COLS, 1, False, warps_for(CHUNK_COLS)
    block_n = next_pow2(n_cols)
    if few_rows(n_rows, sms):
        # Few rows: one row per program, the weight loaded beside the row while every
        # program is resident (`norm_weight_first`), about 8 elements per thread up to 4
        # warps and 16 past that.
        # With the weight loaded after the row's reduction, 8 per thread were 1-4 % faster
        # than 16 everywhere (the sweep of 2026-12-02); loaded first, 16 on 8-16 warps were
        # 2-7 % faster than that at 2560-7168 columns, while at 1024 columns 4 warps beat 2
        # by 4-5 % (bench/norm_decode.py, H100, 2026-12-07).
        warps = max(warps_for(block_n, per_warp=512, cap=32), warps_for(block_n, 256, cap=4))
        return block_n, 1, True, warps
    rows = 1
    if block_n <= 1024:
        rows = min(4096 // block_n, next_pow2(n_rows))
        while rows > 1 and cdiv(n_rows, rows) < PROGRAMS_PER_SM * sms:
            rows //= 2
    # About 16 elements per thread. (8 warps for rows of 8192 was tried on the H200: no gain
    # at 32k rows.)
    return block_n, rows, True, warps_for(block_n * rows)


@functools.lru_cache(maxsize=4096)
def quant_row_params(
    n_rows: int, n_cols: int, sms: int = REFERENCE_SMS
) -> tuple[int, int, bool, int]:
    """`row_params` for the norm + fp8 quant row kernels (`opcore.kernels.triton.quant`):
    the same with many rows, except one row per program on a quarter of the warps per
    element (about 32 elements per thread). From the row_launch sweep at 32k tokens x 4096
    on the H200 (bench/results/2026-12-01-h200-fp8: 85.1 % of copy for
    ``rms_norm_static_fp8_quant`` against 82.1 % on 8 warps, 79.6 against 73.5 % for the
    per-token dynamic quant, 101.0 against 93.1 % for the quant alone). With this rule in
    a later run (bench/results/2026-12-02-h200-session2): 82.8, 73.6 and 97.8 %; only the
    quant alone moved beyond the runs' spread."""
    block_n, rows, single, warps = row_params(n_rows, n_cols, sms)
    if not single:
        return block_n, rows, single, warps
    if few_rows(n_rows, sms):
        # About 8 elements per thread: these kernels load their weight after the reduction.
        return block_n, 1, True, warps_for(block_n, per_warp=256, cap=32)
    return block_n, 1, True, warps_for(block_n, per_warp=1024, cap=32)


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


# The gated activations' program sizes (elements): a latency-bound span, and the tile of the
# bandwidth-bound regime, fitted by bench/sweep_launch.py.
GATED_SPAN = 1024
GATED_TILE = 2048


@functools.lru_cache(maxsize=4096)
def gated_params(n_rows: int, d: int, sms: int = REFERENCE_SMS) -> tuple[int, int, int, int]:
    """``(BLOCK_C, ROWS, num_warps, COLS_FIRST)`` for the gated activations' ``[rows, d]``
    output (`opcore.kernels.triton.activation`).

    - Fewer than ``LATENCY_ROWS_PER_SM * sms`` spans of `GATED_SPAN` elements (decode
      sizes): one span per program on 8 warps (4 elements per thread), a 2-D grid.
    - Else: `GATED_TILE`-element tiles, ``BLOCK_C = even_tile(d, 1024)`` columns by as many
      rows as fill the tile, 8 warps (8 elements per thread), numbered columns first.
    Fitted on the sweep: 0.1-0.3 % behind the best configuration (geometric mean) at 1-16
    and 4096-16384 tokens, where the previous rule was 3.6 and 8.2 % behind.
    """
    if cdiv(n_rows * d, GATED_SPAN) < LATENCY_ROWS_PER_SM * sms:
        block_c = even_tile(d, GATED_SPAN)
        rows = max(1, min(GATED_SPAN // block_c, next_pow2(n_rows)))
        return block_c, rows, warps_for(block_c * rows, per_warp=128, cap=8), 0
    block_c = even_tile(d, GATED_TILE // 2)
    rows = max(1, min(GATED_TILE // block_c, next_pow2(n_rows)))
    return block_c, rows, warps_for(block_c * rows, per_warp=256, cap=8), 1


@functools.lru_cache(maxsize=4096)
def token_head_params(
    n_tokens: int, n_a: int, n_b: int, head_cols: int, sms: int = REFERENCE_SMS
) -> tuple[int, int, int, int]:
    """``(PROGRAMS, BLOCK_A, BLOCK_B, num_warps)`` for kernels over the heads of one token.

    A token's two head groups (q and k; ``n_b`` may be 0) are shared by ``PROGRAMS``
    programs (the grid's second dimension): program ``s`` takes heads ``[s * BLOCK_A,
    (s + 1) * BLOCK_A)`` of the first group and ``[s * BLOCK_B, (s + 1) * BLOCK_B)`` of the
    second, so it loads the token's cos/sin row once for all of them. ``head_cols`` is the
    padded number of columns per head; ``sms`` the device's multiprocessor count.

    - **Fewer tokens than multiprocessors** (latency-bound): the groups are split in powers
      of two (down to one head of the smaller group per program) until tokens x splits
      reach ``sms``, about 128 elements of the program's tile per warp.
    - **Else** one program per token, about 1024 elements of the token's real heads per
      warp (at most 8).

    Fitted on an H100 sweep of every power-of-two split x 1-8 warps (32/8, 28/4, 40/8 x 128
    heads, 1-16384 tokens; ``bench/results/2026-12-06-h100-launch/head-sweep-fit.jsonl``):
    1.00-1.04x each shape's best (geometric mean per token count, worst 1.11x), where the
    earlier rule (about 1024 programs, 256 elements a warp) was 1.04-1.23x.
    """
    smaller = min(n_a, n_b) if n_b else n_a
    splits = 1
    while n_tokens * splits < sms and 2 * splits <= smaller:
        splits *= 2
    programs, block_a, block_b = head_split(n_a, n_b, splits)
    if n_tokens < sms:
        warps = warps_for((block_a + block_b) * head_cols, per_warp=128, cap=8)
    else:
        warps = warps_for((n_a + n_b) * head_cols, per_warp=1024, cap=8)
    return programs, block_a, block_b, warps


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
    n_tokens: int, n_q: int, n_kv: int, head_cols: int, sms: int = REFERENCE_SMS
) -> tuple[int, int, int, int]:
    """`token_head_params` for the fused split kernel: one warp while the heads are split
    (each head's RMS reduction stays within a warp), and about 2048 padded elements per
    warp, at least 2, past ``LATENCY_ROWS_PER_SM`` tokens per multiprocessor. The same H100
    fit as `token_head_params`; at 32k bf16 tokens on an H200 (``bench/sweep_split_qkv.py``,
    ``bench/results/2026-11-29-h200-split-sweep/``) 32/8 heads x 128 reach 90 % of copy
    bandwidth on 2 warps against 78.5 % on 8."""
    programs, block_q, block_kv, warps = token_head_params(n_tokens, n_q, n_kv, head_cols, sms)
    if n_tokens < sms:
        warps = 1
    elif n_tokens > LATENCY_ROWS_PER_SM * sms:
        warps = max(2, warps_for((block_q + block_kv) * head_cols, per_warp=2048, cap=8))
    return programs, block_q, block_kv, warps
