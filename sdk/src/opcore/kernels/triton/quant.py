"""FP8 quantization, alone and fused into RMSNorm or SiLU-and-mul: the eight quant ops.

Each fused kernel reads its activation once (and the residual once) and writes only the
fp8 codes, the scales and, where the op returns one, the residual sum: the norm or
activation output never goes to memory.

Numerics (the ops' contract, `opcore.ir.ops.scaled_fp8_quant` and siblings): math in fp32;
the norm output, and the activation output of the per-token-group op, is rounded to ``x``'s
dtype first (those fused ops are the unfused chain); `silu_and_mul_fp8_quant` quantizes
``silu(gate) * up`` from fp32 (it rounds once); dynamic scales are ``max(min(amax,
scale_ub) / fp8_max, MIN_SCALE)`` with ``amax`` over the finite values only (`_finite_abs`:
NaN and infinities leave the scale alone), divided correctly rounded (``div_rn``); then
``q = round_fp8(sat(y * (1 / scale)))``, where ``sat`` takes ``±inf`` to ``±fp8_max`` and
keeps NaN.
Multiplying by the reciprocal instead of dividing moves a value sitting on an fp8 rounding
tie by one code, at most (the ops' fp8 tolerance). ``round_fp8`` rounds to nearest, ties to
even: by the device's conversion where the platform declares this fp8 dtype as its
``fp8_dtype``, else encoded in integer arithmetic (`_encode_fp8`; see `_encode`).

Layouts: rows are addressed by a row stride (column slices of a wider buffer need no
copy); the last dim is contiguous; the outputs are new contiguous tensors. Encoded codes
are written through a uint8 view of the output, so no Triton fp8 type is involved there
and ``float8_e4m3fnuz`` runs wherever ``float8_e4m3fn`` does, Triton's interpreter (which
has no e4m3fnuz type, rounds fp32 -> fp8 conversions otherwise and truncates fp32 -> bf16
ones, hence ``EMULATE``) included.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from opcore.ir import invalidate_caches
from opcore.ir.quant import MIN_SCALE as _MIN_SCALE
from opcore.ir.quant import fp8_dtype
from opcore.kernels.triton import _bound, _launch
from opcore.kernels.triton._support import require_row_stride
from opcore.platforms import get_current_platform

# The smallest dynamic scale (`opcore.ir.quant.MIN_SCALE`), a plain float for constexpr.
MIN_SCALE = float(_MIN_SCALE)


@functools.lru_cache(maxsize=8)
def fp8_format(dtype: torch.dtype) -> dict[str, float | int | bool]:
    """The constexpr arguments describing an fp8 dtype to `_round_fp8`: ``FP8_MAX`` (its
    largest finite value), ``MIN_EXP`` (the float32 biased exponent of its smallest normal
    value), ``MANT`` (mantissa bits), ``NEG_ZERO`` (whether it has a negative zero: the
    ``fnuz`` formats spend that code on NaN)."""
    info = torch.finfo(dtype)
    return {
        "FP8_MAX": float(info.max),
        "MIN_EXP": round(math.log2(info.smallest_normal)) + 127,
        "MANT": round(-math.log2(info.eps)),
        "NEG_ZERO": "fnuz" not in str(dtype),
    }


@triton.jit
def _encode_fp8(
    y, FP8_MAX: tl.constexpr, MIN_EXP: tl.constexpr, MANT: tl.constexpr, NEG_ZERO: tl.constexpr
):
    """The fp8 code (uint8) of ``y`` (fp32) saturated to ``±FP8_MAX`` and rounded to the
    nearest fp8 value, ties to even.

    With ``E = max(e, MIN_EXP)`` (``e``: the float32 biased exponent of ``|y|``; below the
    smallest normal, the subnormal spacing), ``k = round(|y| / 2 ** (E - 127 - MANT))`` is
    an integer in ``[0, 2 ** (MANT + 1)]``, rounded by adding and subtracting 2**23 (nearest
    even in fp32), and the code's magnitude is ``(E - MIN_EXP) << MANT + k`` (a ``k`` that
    rounded up into the next binade lands on its first code). Then the sign bit (not on
    zero in a format without a negative zero), and NaN's code. Encoding here rather than
    converting keeps the result the same on every backend: Triton's interpreter rounds
    fp32 -> fp8 conversions otherwise (ties away, subnormals truncated, NaN to a number)
    and has no e4m3fnuz at all."""
    a = tl.minimum(tl.abs(y), FP8_MAX)
    big_e = tl.maximum(a.to(tl.int32, bitcast=True) >> 23, MIN_EXP)
    inverse = ((254 - big_e + MANT) << 23).to(tl.float32, bitcast=True)  # 1 / spacing
    k = ((a * inverse + 8388608.0) - 8388608.0).to(tl.int32)
    code = ((big_e - MIN_EXP) << MANT) + k
    negative = y.to(tl.int32, bitcast=True) < 0  # the sign bit, -0.0 included
    if NEG_ZERO:
        code = tl.where(negative, code | 128, code)
        nan_code = 127
    else:
        code = tl.where(negative & (code != 0), code | 128, code)
        nan_code = 128
    code = tl.where(y != y, nan_code, code)
    return code.to(tl.uint8)


# Triton's interpreter runs these kernels (TRITON_INTERPRET=1 when Triton was imported).
INTERPRETED = type(_encode_fp8).__name__ == "InterpretedFunction"


@triton.jit
def _round_to(y, dtype, EMULATE: tl.constexpr):
    """``y`` (fp32) rounded to ``dtype``, to nearest even. EMULATE (Triton's interpreter,
    which truncates fp32 -> bf16 conversions): bf16 is rounded on the bits (add half an ulp
    minus one, plus the kept lowest bit, then drop 16 bits); NaN stays NaN. A GPU's
    conversion instruction rounds to nearest even itself."""
    if EMULATE and dtype == tl.bfloat16:
        b = y.to(tl.uint32, bitcast=True)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
        r = tl.where(y != y, y, b.to(tl.float32, bitcast=True))
        return r.to(dtype)
    else:
        return y.to(dtype)


@triton.jit
def _silu_mul(g, u):
    """``silu(g) * u = g * sigmoid(g) * u``, in fp32 (not rounded)."""
    return g * tl.sigmoid(g) * u


@triton.jit
def _finite_abs(y):
    """``|y|`` where ``y`` is finite, else 0 (NaN fails the comparison, as does an
    infinity): the values a dynamic scale's ``amax`` is the largest of."""
    a = tl.abs(y)
    return tl.where(a <= 3.4028234663852886e38, a, 0.0)


@triton.jit
def _finite_amax(y):
    """Per row of ``y`` (``[R, C]``), the largest finite ``|y|`` (0 for none).

    The plain ``max(|y|)`` first: one instruction per value, where filtering each value
    first takes three (on an H200 the filter made the per-token kernels issue-bound). It is
    the answer wherever it is finite: no infinity in the row, and NaN either absent or
    skipped by the device's ``max`` (a GPU's is; the interpreter's numpy propagates it).
    Only when some row's is not finite are the rows done again with the filter."""
    a = tl.max(tl.abs(y), axis=1)
    if tl.min(tl.where(a <= 3.4028234663852886e38, 1, 0)) == 0:
        a = tl.max(_finite_abs(y), axis=1)
    return a


@triton.jit
def _store_fp8(
    ptrs,
    y,
    mask,
    FP8_MAX: tl.constexpr,
    MIN_EXP: tl.constexpr,
    MANT: tl.constexpr,
    NEG_ZERO: tl.constexpr,
    ENCODE: tl.constexpr,
    SATURATES: tl.constexpr,
):
    """Store ``round_fp8(sat(y))``. ENCODE: the codes from `_encode_fp8` into a uint8
    view; else convert, which rounds to nearest even, into the fp8 tensor itself (a device
    that computes this fp8 format converts in one instruction per pair), saturating first
    (NaN kept) unless SATURATES: the device's conversion does that itself
    (``Platform.fp8_convert_saturates``), and the clamp's three instructions per value are
    a quarter of what the row kernels issue per value."""
    if ENCODE:
        tl.store(ptrs, _encode_fp8(y, FP8_MAX, MIN_EXP, MANT, NEG_ZERO), mask=mask)
    elif SATURATES:
        tl.store(ptrs, y.to(ptrs.dtype.element_ty), mask=mask)
    else:
        c = tl.where(y != y, y, tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX))
        tl.store(ptrs, c.to(ptrs.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- static, elementwise
@triton.jit
def _static_kernel(
    x_ptr,
    x_stride,
    scale_ptr,
    q_ptr,
    n_rows,
    d,
    GATED: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_EXP: tl.constexpr,
    MANT: tl.constexpr,
    NEG_ZERO: tl.constexpr,
    ENCODE: tl.constexpr,
    EMULATE: tl.constexpr,
    SATURATES: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ROWS: tl.constexpr,
    COLS_FIRST: tl.constexpr,
):
    """``q = round_fp8(y / scale)`` over a ``[ROWS, BLOCK_C]`` tile of the ``[rows, d]``
    output; ``y = x`` or, GATED, ``silu(x[:, :d]) * x[:, d:]`` in fp32 (not rounded to
    ``x``'s dtype: `silu_and_mul_fp8_quant` rounds once). Tiles are numbered on a 2-D grid
    ``(row blocks, column tiles)``, or with ``COLS_FIRST`` on a 1-D grid that walks a row
    block's columns first (as the gated activations' kernel may)."""
    # The gated activations' tile numbering (`opcore.kernels.triton.activation`), copied:
    # moving it into a shared helper edits that module, which makes the shipped tuning
    # tables' activation entries stale until a device searches them again.
    if COLS_FIRST:
        col_tiles = tl.cdiv(d, BLOCK_C)
        pid = tl.program_id(0).to(tl.int64)
        row_block = pid // col_tiles
        col_tile = pid % col_tiles
    else:
        row_block = tl.program_id(0).to(tl.int64)
        col_tile = tl.program_id(1)
    rows = row_block * ROWS + tl.arange(0, ROWS)
    cols = col_tile * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < n_rows)[:, None] & (cols < d)[None, :]
    x_rows = x_ptr + rows[:, None] * x_stride + cols[None, :]
    y = tl.load(x_rows, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        u = tl.load(x_rows + d, mask=mask, other=0.0).to(tl.float32)
        y = _silu_mul(y, u)
    inv = tl.math.div_rn(1.0, tl.load(scale_ptr).to(tl.float32))
    q_at = q_ptr + rows[:, None] * d + cols[None, :]
    _store_fp8(q_at, y * inv, mask, FP8_MAX, MIN_EXP, MANT, NEG_ZERO, ENCODE, SATURATES)


_forced: list[bool | None] = [None]  # codes_encoded's setting (one per process)


@contextlib.contextmanager
def codes_encoded(flag: bool = True) -> Iterator[None]:
    """Within the block, the kernels encode fp8 codes in integer arithmetic (``True``) or
    let the device convert (``False``), whatever the platform declares: to check and time
    both paths on one device (``bench/fp8_kernels.py``). Converting is wrong under the
    interpreter (it does not round to nearest even) and fails where Triton has no
    conversion to the fp8 type. Not thread-safe; blocks nest."""
    before = _forced[0]
    _forced[0] = bool(flag)
    try:
        yield
    finally:
        _forced[0] = before


def _encode(dtype: torch.dtype) -> bool:
    """Whether the kernels encode fp8 codes themselves (`_encode_fp8`): under the
    interpreter (its conversions do not round to nearest even), and on a platform that does
    not declare ``dtype`` as its ``fp8_dtype`` (a device without fp8 conversions, such as
    an NVIDIA GPU before sm89). Elsewhere the device converts, in one instruction per pair
    of values instead of about twenty integer operations per value: at 32k tokens the
    encoding alone would make the fused kernels compute-bound."""
    if _forced[0] is not None:
        return _forced[0]
    return INTERPRETED or get_current_platform().fp8_dtype != dtype


def _modes(dtype: torch.dtype) -> dict[str, bool]:
    encode = _encode(dtype)
    saturates = not encode and get_current_platform().fp8_convert_saturates
    return {"ENCODE": encode, "EMULATE": INTERPRETED, "SATURATES": saturates}


def _q_arg(q: torch.Tensor) -> torch.Tensor:
    """The fp8 output as the kernel takes it: a uint8 view when the kernel encodes."""
    return q.view(torch.uint8) if _encode(q.dtype) else q


def _fp8_out(shape, device) -> tuple[torch.Tensor, dict[str, float | int | bool]]:
    dtype = fp8_dtype()
    return _bound.empty(shape, dtype=dtype, device=device), fp8_format(dtype)


def _static(x: torch.Tensor, scale: torch.Tensor, gated: bool, what: str) -> torch.Tensor:
    d = x.shape[-1] // 2 if gated else x.shape[-1]
    q, fmt = _fp8_out((*x.shape[:-1], d), x.device)
    n_rows = q.numel() // d if d else 0
    if n_rows == 0:
        return q
    stride = require_row_stride(x, what)
    if _static_launch[0] is not None:
        block_c, rows, warps, cols_first = _static_launch[0]
    elif gated:
        # The gated activations' fitted launch (the same two-half reads): at 32k tokens x
        # 14336 on an H100, 752 us against 810 us on elementwise tiles (2026-12-06).
        sms = _launch.multiprocessors(x.device.index)
        block_c, rows, warps, cols_first = _launch.gated_params(n_rows, d, sms)
    else:
        block_c, rows, warps = _launch.elementwise_params(n_rows, d)
        cols_first = 0
    row_blocks, col_tiles = _launch.cdiv(n_rows, rows), _launch.cdiv(d, block_c)
    grid = (row_blocks * col_tiles,) if cols_first else (row_blocks, col_tiles)
    _bound.launch(
        _static_kernel,
        grid,
        x,
        stride,
        scale,
        _q_arg(q),
        n_rows,
        d,
        GATED=gated,
        **fmt,
        **_modes(q.dtype),
        BLOCK_C=block_c,
        ROWS=rows,
        COLS_FIRST=bool(cols_first),
        num_warps=warps,
    )
    return q


_static_launch: list[tuple[int, int, int, int] | None] = [None]  # static_launch's setting


@contextlib.contextmanager
def static_launch(
    block_c: int, rows: int, num_warps: int, cols_first: bool = False
) -> Iterator[None]:
    """Within the block, the elementwise kernels (`scaled_fp8_quant`,
    `silu_and_mul_fp8_quant`) take ``[rows, block_c]`` output tiles on ``num_warps`` warps,
    numbered columns first where ``cols_first``, instead of the launch model's choice: to
    measure launch configurations on a device (``bench/fp8_kernels.py bench --sweep``).
    Each a power of two, ``block_c`` at most 16384, ``rows`` and ``num_warps`` at most 32.
    Not thread-safe."""
    for name, v, cap in (
        ("block_c", block_c, 16384),
        ("rows", rows, 32),
        ("num_warps", num_warps, 32),
    ):
        _check_pow2("static_launch", name, v, cap)
    with _forcing(_static_launch, (block_c, rows, num_warps, int(bool(cols_first)))):
        yield


@contextlib.contextmanager
def _forcing(setting: list, value: tuple) -> Iterator[None]:
    """``setting[0] = value`` within the block. Dispatch's routes are dropped on entry and
    on exit (`opcore.ir.invalidate_caches`): a call bound inside the block would otherwise
    keep replaying the forced launch after it, and one bound before would ignore it."""
    before = setting[0]
    setting[0] = value
    invalidate_caches()
    try:
        yield
    finally:
        setting[0] = before
        invalidate_caches()


def _check_pow2(what: str, name: str, v: object, cap: int) -> None:
    if not isinstance(v, int) or v < 1 or v & (v - 1) or v > cap:
        raise ValueError(f"{what}: {name} must be a power of two in 1..{cap}, got {v!r}")


def scaled_fp8_quant(x, scale):
    """`scaled_fp8_quant` on a Triton device: ``round_fp8(x / scale)``, shaped like ``x``."""
    return _static(x, scale, False, "scaled_fp8_quant: x")


def silu_and_mul_fp8_quant(x, scale):
    """`silu_and_mul_fp8_quant` on a Triton device, one pass over ``x``: ``round_fp8(silu(
    gate) * up / scale)`` from fp32, rounded once."""
    return _static(x, scale, True, "silu_and_mul_fp8_quant: x")


# --------------------------------------------------------------------------- rows: norm / per token
@triton.jit
def _row_values(
    x_rows,
    r_rows,
    res_rows,
    w_ptr,
    cols,
    mask,
    n_cols,
    rstd,
    STORE_RES: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    NORM: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    EMULATE: tl.constexpr,
):
    """The values to quantize in a chunk, fp32: ``x`` (with a residual, ``x + r`` rounded
    to the residual's dtype, stored when STORE_RES, else re-read from where it was
    stored); NORM: ``x * rstd * weight`` rounded to ``x``'s dtype."""
    if HAS_RESIDUAL:
        if STORE_RES:
            x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            r = tl.load(r_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            s = _round_to(x + r, res_rows.dtype.element_ty, EMULATE)
            tl.store(res_rows + cols[None, :], s, mask=mask)
            x = s.to(tl.float32)
        else:
            x = tl.load(res_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    else:
        x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if NORM:
        y = x * rstd[:, None]
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            y = y * w[None, :]
        x = _round_to(y, x_rows.dtype.element_ty, EMULATE).to(tl.float32)
    return x


@triton.jit
def _row_quant_kernel(
    x_ptr,
    x_stride,
    r_ptr,
    r_stride,
    w_ptr,
    res_ptr,
    scale_ptr,
    q_ptr,
    s_ptr,
    n_rows,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    NORM: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    DYNAMIC: tl.constexpr,
    HAS_UB: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_EXP: tl.constexpr,
    MANT: tl.constexpr,
    NEG_ZERO: tl.constexpr,
    ENCODE: tl.constexpr,
    EMULATE: tl.constexpr,
    SATURATES: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    N_CHUNKS: tl.constexpr,
):
    """``ROWS`` whole rows per program. NORM: ``y = rms_norm(x [+ r]) `` (``rstd =
    rsqrt(mean(x**2) + eps)``), else ``y = x``. DYNAMIC: ``scale = max(min(amax, ub) /
    FP8_MAX, MIN_SCALE)`` per row (``amax``: the largest finite ``|y|``), stored; else the
    one static scale. ``q =
    round_fp8(y / scale)``. A row that fits in ``BLOCK_N`` is read once; a longer one is
    read in ``N_CHUNKS`` chunks once per pass (sum of squares, amax, quantize)."""
    eps = tl.cast(eps, tl.float32)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    row_mask = row_ok[:, None]
    x_rows = x_ptr + rows[:, None] * x_stride
    r_rows = r_ptr + rows[:, None] * r_stride
    res_rows = res_ptr + rows[:, None] * n_cols
    q_rows = q_ptr + rows[:, None] * n_cols
    inv_n = 1.0 / tl.cast(n_cols, tl.float32)
    rstd = tl.zeros([ROWS], dtype=tl.float32)
    if SINGLE_PASS:
        cols = tl.arange(0, BLOCK_N)
        mask = row_mask & (cols < n_cols)[None, :]
        if NORM:
            x = _row_values(
                x_rows, r_rows, res_rows, w_ptr, cols, mask, n_cols, rstd,
                True, HAS_RESIDUAL, False, False, EMULATE,
            )  # fmt: skip
            rstd = tl.rsqrt(tl.sum(x * x, axis=1) * inv_n + eps)
            y = x * rstd[:, None]
            if HAS_WEIGHT:
                w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
                y = y * w[None, :]
            y = _round_to(y, x_ptr.dtype.element_ty, EMULATE).to(tl.float32)
        else:
            y = _row_values(
                x_rows, r_rows, res_rows, w_ptr, cols, mask, n_cols, rstd,
                True, HAS_RESIDUAL, False, False, EMULATE,
            )  # fmt: skip
        if DYNAMIC:
            amax = _finite_amax(y)
        else:
            amax = tl.zeros([ROWS], dtype=tl.float32)
    else:
        # pass 1 (norm or residual): the sum of squares; the residual sum is stored here
        if NORM or HAS_RESIDUAL:
            acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for c in range(N_CHUNKS):
                cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
                mask = row_mask & (cols < n_cols)[None, :]
                x = _row_values(
                    x_rows, r_rows, res_rows, w_ptr, cols, mask, n_cols, rstd,
                    True, HAS_RESIDUAL, False, False, EMULATE,
                )  # fmt: skip
                acc += x * x
            rstd = tl.rsqrt(tl.sum(acc, axis=1) * inv_n + eps)
        # pass 2 (dynamic): the row's amax of the values to quantize
        amax = tl.zeros([ROWS], dtype=tl.float32)
        if DYNAMIC:
            peak = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for c in range(N_CHUNKS):
                cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
                mask = row_mask & (cols < n_cols)[None, :]
                y = _row_values(
                    x_rows, r_rows, res_rows, w_ptr, cols, mask, n_cols, rstd,
                    False, HAS_RESIDUAL, NORM, HAS_WEIGHT, EMULATE,
                )  # fmt: skip
                peak = tl.maximum(peak, _finite_abs(y))
            amax = tl.max(peak, axis=1)
    if DYNAMIC:
        if HAS_UB:
            amax = tl.minimum(amax, tl.load(scale_ptr).to(tl.float32))
        scale = tl.maximum(tl.math.div_rn(amax, FP8_MAX), MIN_SCALE)
        tl.store(s_ptr + rows, scale, mask=row_ok)
        inv = tl.math.div_rn(tl.full([ROWS], 1.0, tl.float32), scale)
    else:
        inv = tl.math.div_rn(tl.full([ROWS], 1.0, tl.float32), tl.load(scale_ptr).to(tl.float32))
    if SINGLE_PASS:
        _store_fp8(
            q_rows + cols[None, :], y * inv[:, None], mask,
            FP8_MAX, MIN_EXP, MANT, NEG_ZERO, ENCODE, SATURATES,
        )  # fmt: skip
    else:
        # pass 3: quantize
        for c in range(N_CHUNKS):
            cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = row_mask & (cols < n_cols)[None, :]
            y = _row_values(
                x_rows, r_rows, res_rows, w_ptr, cols, mask, n_cols, rstd,
                False, HAS_RESIDUAL, NORM, HAS_WEIGHT, EMULATE,
            )  # fmt: skip
            _store_fp8(
                q_rows + cols[None, :], y * inv[:, None], mask,
                FP8_MAX, MIN_EXP, MANT, NEG_ZERO, ENCODE, SATURATES,
            )  # fmt: skip


_row_launch: list[tuple[int, int] | None] = [None]  # row_launch's setting (one per process)


@contextlib.contextmanager
def row_launch(rows: int, num_warps: int) -> Iterator[None]:
    """Within the block, the row kernels (the norm + quant ops and the per-token dynamic
    quant) take ``rows`` rows per program on ``num_warps`` warps instead of
    `_launch.row_params`' choice, for rows that fit one register tile: to measure launch
    configurations on a device (``bench/fp8_kernels.py sweep``). Both must be powers of
    two (Triton's layouts need them), ``rows * BLOCK_N <= 16384``. Not thread-safe."""
    for name, v in (("rows", rows), ("num_warps", num_warps)):
        _check_pow2("row_launch", name, v, 32)
    with _forcing(_row_launch, (rows, num_warps)):
        yield


def _row_params(n_rows: int, n_cols: int, sms: int) -> tuple[int, int, bool, int]:
    """`_launch.quant_row_params`, or row_launch's setting where the row fits one tile."""
    block_n, rows, single, warps = _launch.quant_row_params(n_rows, n_cols, sms)
    forced = _row_launch[0]
    if forced is not None and single:
        rows, warps = forced
        if rows * block_n > _launch.MAX_FUSED_COLS:
            raise ValueError(
                f"row_launch: {rows} rows of {block_n} columns exceed one register tile "
                f"({_launch.MAX_FUSED_COLS} elements)"
            )
    return block_n, rows, single, warps


def _rows_quant(
    x, residual, weight, epsilon, scale, *, norm: bool, dynamic: bool, what: str
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Launch `_row_quant_kernel`; returns ``(q, scales or None, residual sum or None)``.
    ``scale``: the static scale, or with ``dynamic`` the optional ``scale_ub``."""
    n_cols = x.shape[-1]
    q, fmt = _fp8_out(x.shape, x.device)
    scales = (
        _bound.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device) if dynamic else None
    )
    res = None if residual is None else _bound.empty(x.shape, dtype=x.dtype, device=x.device)
    n_rows = x.numel() // n_cols if n_cols else 0
    if n_rows == 0:
        return q, scales, res
    sx = require_row_stride(x, f"{what}: x")
    sr = 0 if residual is None else require_row_stride(residual, f"{what}: residual")
    sms = _launch.multiprocessors(x.device.index)
    block_n, rows, single, warps = _row_params(n_rows, n_cols, sms)
    _bound.launch(
        _row_quant_kernel,
        (_launch.cdiv(n_rows, rows),),
        x,
        sx,
        x if residual is None else residual,
        sr,
        x if weight is None else weight,
        x if res is None else res,
        x if scale is None else scale,
        _q_arg(q),
        x if scales is None else scales,
        n_rows,
        n_cols,
        float(epsilon),
        HAS_RESIDUAL=residual is not None,
        NORM=norm,
        HAS_WEIGHT=weight is not None,
        DYNAMIC=dynamic,
        HAS_UB=dynamic and scale is not None,
        **fmt,
        **_modes(q.dtype),
        MIN_SCALE=MIN_SCALE,
        BLOCK_N=block_n,
        ROWS=rows,
        SINGLE_PASS=single,
        N_CHUNKS=1 if single else _launch.cdiv(n_cols, block_n),
        num_warps=warps,
    )
    return q, scales, res


def dynamic_per_token_scaled_fp8_quant(x, scale_ub=None):
    """`dynamic_per_token_scaled_fp8_quant` on a Triton device: ``(q, scales)``."""
    q, s, _ = _rows_quant(
        x, None, None, 0.0, scale_ub, norm=False, dynamic=True, what="dynamic_per_token"
    )
    return q, s


def rms_norm_static_fp8_quant(x, weight, epsilon, scale):
    """`rms_norm_static_fp8_quant` on a Triton device: one read of ``x``."""
    q, _, _ = _rows_quant(
        x, None, weight, epsilon, scale, norm=True, dynamic=False, what="rms_norm_static"
    )
    return q


def fused_add_rms_norm_static_fp8_quant(x, residual, weight, epsilon, scale):
    """`fused_add_rms_norm_static_fp8_quant` on a Triton device: ``(q, x + residual)``."""
    q, _, res = _rows_quant(
        x, residual, weight, epsilon, scale, norm=True, dynamic=False, what="fused_add_rms_norm"
    )
    return q, res


def rms_norm_dynamic_per_token_quant(x, weight, epsilon, residual=None, scale_ub=None):
    """`rms_norm_dynamic_per_token_quant` on a Triton device: ``(q, scales, residual)``."""
    return _rows_quant(
        x, residual, weight, epsilon, scale_ub, norm=True, dynamic=True, what="rms_norm_dynamic"
    )


# --------------------------------------------------------------------------- token groups
@triton.jit
def _group_quant_kernel(
    x_ptr,
    x_stride,
    q_ptr,
    s_ptr,
    n_groups_total,
    groups,
    group_size,
    d,
    s_row_stride,
    s_group_stride,
    GATED: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_EXP: tl.constexpr,
    MANT: tl.constexpr,
    NEG_ZERO: tl.constexpr,
    ENCODE: tl.constexpr,
    EMULATE: tl.constexpr,
    SATURATES: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """``GROUPS`` (row, group) pairs per program, one group of ``group_size`` columns each:
    ``y`` (``x``, or GATED ``silu(gate) * up`` rounded to ``x``'s dtype), ``scale =
    max(amax / FP8_MAX, MIN_SCALE)`` (``amax``: the largest finite ``|y|``) stored at
    ``row * s_row_stride + group * s_group_stride``, ``q = round_fp8(y / scale)``."""
    gid = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    ok = gid < n_groups_total
    row = gid // groups
    grp = gid % groups
    j = tl.arange(0, BLOCK_S)
    mask = ok[:, None] & (j < group_size)[None, :]
    col = grp[:, None] * group_size + j[None, :]
    x_at = x_ptr + row[:, None] * x_stride + col
    y = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        u = tl.load(x_at + d, mask=mask, other=0.0).to(tl.float32)
        # rounded to x's dtype as silu_and_mul returns it: this op is the unfused chain
        y = _round_to(_silu_mul(y, u), x_ptr.dtype.element_ty, EMULATE).to(tl.float32)
    scale = tl.maximum(tl.math.div_rn(_finite_amax(y), FP8_MAX), MIN_SCALE)
    tl.store(s_ptr + row * s_row_stride + grp * s_group_stride, scale, mask=ok)
    inv = tl.math.div_rn(tl.full([GROUPS], 1.0, tl.float32), scale)
    q_at = q_ptr + row[:, None] * d + col
    _store_fp8(q_at, y * inv[:, None], mask, FP8_MAX, MIN_EXP, MANT, NEG_ZERO, ENCODE, SATURATES)


@functools.lru_cache(maxsize=1024)
def group_params(n_groups: int, group_size: int) -> tuple[int, int, int]:
    """``(BLOCK_S, GROUPS, num_warps)``: a program takes ``GROUPS`` groups of up to
    ``BLOCK_S`` columns, about 4096 elements, fewer while that leaves fewer than
    ``4 * MIN_PROGRAMS`` programs (as `_launch.elementwise_params` sizes its tiles)."""
    block_s = _launch.next_pow2(group_size)
    tile = max(4096, block_s)
    while tile > max(512, block_s) and _launch.cdiv(n_groups * block_s, tile) < (
        4 * _launch.MIN_PROGRAMS
    ):
        tile //= 2
    groups = max(1, min(tile // block_s, _launch.next_pow2(n_groups)))
    return block_s, groups, _launch.warps_for(block_s * groups, per_warp=256, cap=8)


def _group(x, group_size, column_major, gated, what):
    d = x.shape[-1] // 2 if gated else x.shape[-1]
    lead = tuple(x.shape[:-1])
    q, fmt = _fp8_out((*lead, d), x.device)
    groups = d // group_size
    n_rows = math.prod(lead)
    if column_major:
        scales = _bound.empty((groups, *lead), dtype=torch.float32, device=x.device)
        s_row, s_group = 1, n_rows
    else:
        scales = _bound.empty((*lead, groups), dtype=torch.float32, device=x.device)
        s_row, s_group = groups, 1
    total = n_rows * groups
    if total == 0:
        return q, scales
    stride = require_row_stride(x, what)
    block_s, per_program, warps = group_params(total, group_size)
    _bound.launch(
        _group_quant_kernel,
        (_launch.cdiv(total, per_program),),
        x,
        stride,
        _q_arg(q),
        scales,
        total,
        groups,
        group_size,
        d,
        s_row,
        s_group,
        GATED=gated,
        **fmt,
        **_modes(q.dtype),
        MIN_SCALE=MIN_SCALE,
        BLOCK_S=block_s,
        GROUPS=per_program,
        num_warps=warps,
    )
    return q, scales


def per_token_group_quant_fp8(x, group_size=128, column_major_scales=False):
    """`per_token_group_quant_fp8` on a Triton device: ``(q, scales)``."""
    return _group(x, group_size, column_major_scales, False, "per_token_group_quant_fp8: x")


def silu_and_mul_per_token_group_fp8_quant(x, group_size=128):
    """`silu_and_mul_per_token_group_fp8_quant` on a Triton device, one pass over ``x``."""
    return _group(x, group_size, False, True, "silu_and_mul_per_token_group_fp8_quant: x")
