"""RMSNorm and fused residual-add + RMSNorm.

One kernel serves both ops: each program owns ``ROWS`` whole rows (so in-place writes
never race), loads them once, sums squares in fp32, and writes the result once. Rows
longer than `_launch.MAX_FUSED_COLS` take a two-pass path whose second pass re-reads the
row (from L2 in practice); its chunk count is a compile-time constant (a runtime loop
bound does not run under the interpreter with current numpy). Rows are addressed by a row
stride, so a column slice of a wider buffer needs no copy; the last dim must be contiguous.

With few rows (`_launch.norm_weight_first`) the weight is loaded before the row's
reduction (``WEIGHT_FIRST``), so that its load does not wait for the reduction's barrier;
the arithmetic is the same either way.

Numerics: the residual sum is rounded to the input dtype (it is an output and the next
layer's input) and the norm is computed from that rounded value; the norm itself is fp32
``x * rsqrt(mean(x[:variance_size]**2) + eps) * weight``, cast once on store.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opcore.kernels.triton import PROVIDER, _bound, _launch
from opcore.kernels.triton._support import require_row_stride
from opcore.tuning.runtime import launch_config


@triton.jit
def _chunk(c, BLOCK_N: tl.constexpr, row_mask, n_cols):
    """Columns of chunk ``c`` of the program's rows, and their load/store mask."""
    cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
    return cols, row_mask & (cols < n_cols)[None, :]


@triton.jit
def _load_f32(rows, cols, mask):
    return tl.load(rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _norm_input(x_rows, r_rows, res_rows, cols, mask, HAS_RESIDUAL: tl.constexpr):
    """The values to normalise, in fp32: ``x``; with a residual, ``x + r`` rounded to the
    residual's dtype, which is stored (it is an output) and normalised as rounded."""
    x = _load_f32(x_rows, cols, mask)
    if HAS_RESIDUAL:
        r = _load_f32(r_rows, cols, mask)
        s = (x + r).to(res_rows.dtype.element_ty)
        tl.store(res_rows + cols[None, :], s, mask=mask)
        x = s.to(tl.float32)
    return x


@triton.jit
def _squares(x, cols, var_size, PARTIAL_VARIANCE: tl.constexpr):
    """``x * x`` over the first ``var_size`` columns, 0 past them. Where the variance covers
    the whole row the loads' zeros past it already square to 0, and the mask is left out:
    compiled for sm_90 the few-row kernel was 27 instructions of 259 shorter in fp16 (19 of
    275 in bf16), nearly all before the reduction's barrier
    (bench/results/2026-12-07-h100-session14/)."""
    if PARTIAL_VARIANCE:
        return tl.where((cols < var_size)[None, :], x * x, 0.0)
    return x * x


@triton.jit
def _store_scaled(y, w_ptr, out_rows, cols, n_cols, mask, HAS_WEIGHT: tl.constexpr):
    """Store ``y`` (fp32) times the weight when there is one, cast once to the output dtype."""
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = y * w[None, :]
    tl.store(out_rows + cols[None, :], y.to(out_rows.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    x_stride,
    r_ptr,
    r_stride,
    w_ptr,
    out_ptr,
    out_stride,
    res_ptr,
    res_stride,
    n_rows,
    n_cols,
    var_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    N_CHUNKS: tl.constexpr,
    WEIGHT_FIRST: tl.constexpr = False,
    PARTIAL_VARIANCE: tl.constexpr = True,
):
    eps = tl.cast(eps, tl.float32)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = (rows < n_rows)[:, None]
    x_rows = x_ptr + rows[:, None] * x_stride
    r_rows = r_ptr + rows[:, None] * r_stride
    out_rows = out_ptr + rows[:, None] * out_stride
    res_rows = res_ptr + rows[:, None] * res_stride
    inv_n = 1.0 / tl.cast(var_size, tl.float32)
    if SINGLE_PASS:
        cols, mask = _chunk(0, BLOCK_N, row_mask, n_cols)
        if WEIGHT_FIRST and HAS_WEIGHT:
            # The weight's load issued beside the row's, before the reduction's barrier:
            # a call of a few rows then waits for one memory round trip, not two.
            w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0)
        x = _norm_input(x_rows, r_rows, res_rows, cols, mask, HAS_RESIDUAL)
        rstd = tl.rsqrt(tl.sum(_squares(x, cols, var_size, PARTIAL_VARIANCE), axis=1) * inv_n + eps)
        if WEIGHT_FIRST and HAS_WEIGHT:
            y = x * rstd[:, None] * w.to(tl.float32)[None, :]
            tl.store(out_rows + cols[None, :], y.to(out_rows.dtype.element_ty), mask=mask)
        else:
            _store_scaled(x * rstd[:, None], w_ptr, out_rows, cols, n_cols, mask, HAS_WEIGHT)
    else:
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for c in range(N_CHUNKS):
            cols, mask = _chunk(c, BLOCK_N, row_mask, n_cols)
            x = _norm_input(x_rows, r_rows, res_rows, cols, mask, HAS_RESIDUAL)
            acc += _squares(x, cols, var_size, PARTIAL_VARIANCE)
        rstd = tl.rsqrt(tl.sum(acc, axis=1) * inv_n + eps)
        for c in range(N_CHUNKS):
            cols, mask = _chunk(c, BLOCK_N, row_mask, n_cols)
            # Re-read the normalised input: the residual this program just wrote, or x.
            if HAS_RESIDUAL:
                x = _load_f32(res_rows, cols, mask)
            else:
                x = _load_f32(x_rows, cols, mask)
            _store_scaled(x * rstd[:, None], w_ptr, out_rows, cols, n_cols, mask, HAS_WEIGHT)


def _launch_norm(
    x, r, weight, out, res, epsilon, variance_size, x_stride, r_stride, out_stride, res_stride
):
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    if n_rows == 0 or n_cols == 0:
        return
    has_res = r is not None
    op = "fused_add_rms_norm" if has_res else "rms_norm"
    # A tuned choice for this size (docs/tuning.md), else the launch model (_launch).
    cfg = launch_config(op, PROVIDER, x.dtype, n_rows, (n_cols,))
    sms = _launch.multiprocessors(x.device.index)
    if cfg is None:
        block_n, rows, single, warps = _launch.row_params(n_rows, n_cols, sms)
    else:
        block_n, rows, warps = cfg["BLOCK_N"], cfg["ROWS"], cfg["num_warps"]
        single = block_n >= n_cols
    weight_first = False
    if weight is not None and single and _launch.few_rows(n_rows, sms):
        vectors = _launch.norm_vector_loads(
            x.element_size(), n_cols, x_stride, r_stride, out_stride, res_stride
        )
        resident = _launch.norm_resident_warps(x.device.index, vectors)
        weight_first = _launch.norm_weight_first(n_rows, rows, warps, sms, resident)
    var_size = n_cols if variance_size is None else int(variance_size)
    _bound.launch(
        _rms_norm_kernel,
        (_launch.cdiv(n_rows, rows),),
        x,
        x_stride,
        r if has_res else x,
        r_stride,
        weight if weight is not None else x,
        out,
        out_stride,
        res if has_res else out,
        res_stride,
        n_rows,
        n_cols,
        var_size,
        float(epsilon),
        HAS_RESIDUAL=has_res,
        HAS_WEIGHT=weight is not None,
        BLOCK_N=block_n,
        ROWS=rows,
        SINGLE_PASS=single,
        N_CHUNKS=1 if single else _launch.cdiv(n_cols, block_n),
        WEIGHT_FIRST=weight_first,
        PARTIAL_VARIANCE=var_size < n_cols,
        num_warps=warps,
    )


def rms_norm(x, weight, epsilon, variance_size=None):
    """`rms_norm` on a Triton device: a new tensor shaped and typed like ``x``."""
    out = _bound.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.shape[-1]
    sx = require_row_stride(x, "rms_norm: x")
    _launch_norm(x, None, weight, out, None, epsilon, variance_size, sx, 0, n, 0)
    return out


def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
    """`fused_add_rms_norm` into new tensors: ``(rms_norm(x + x_residual), x + x_residual)``."""
    out = _bound.empty(x.shape, dtype=x.dtype, device=x.device)
    res = _bound.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.shape[-1]
    sx = require_row_stride(x, "fused_add_rms_norm: x")
    sr = require_row_stride(x_residual, "fused_add_rms_norm: x_residual")
    _launch_norm(x, x_residual, weight, out, res, epsilon, variance_size, sx, sr, n, n)
    return out, res


def fused_add_rms_norm_inplace(x, x_residual, weight, epsilon, variance_size=None):
    """In-place `fused_add_rms_norm`: ``x`` receives the normalised output and
    ``x_residual`` the sum; returns ``(x, x_residual)``."""
    sx = require_row_stride(x, "fused_add_rms_norm: x")
    sr = require_row_stride(x_residual, "fused_add_rms_norm: x_residual")
    _launch_norm(x, x_residual, weight, x, x_residual, epsilon, variance_size, sx, sr, sx, sr)
    return x, x_residual
