"""Gated activations: ``silu_and_mul`` and ``gelu_and_mul`` (erf or tanh GELU).

``x[..., :d]`` is the gate and ``x[..., d:]`` the up projection, ``d = x.shape[-1] // 2``.
A program covers a ``[ROWS, BLOCK_C]`` tile of the ``[rows, d]`` output, reading the two
halves of the same input rows; the math is fp32 and the product is rounded once. Tiles are
numbered on a 2-D grid ``(row blocks, column tiles)``, or with ``COLS_FIRST`` on a 1-D grid
whose consecutive programs walk along a row block's columns, so programs that run together
touch neighbouring memory (the order a flattened pointwise loop has; a launch-space choice).
Where the tiles cover the output exactly (``EVEN``: ``d`` a multiple of ``BLOCK_C`` and the
rows of ``ROWS``, as the launch model's tiles usually are) the kernel loads and stores
without masks: at decode sizes the call lasts about one memory round trip, and the masks'
arithmetic comes before the first load.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from opcore.kernels.triton import PROVIDER, _bound, _launch
from opcore.kernels.triton._support import require_row_stride
from opcore.tuning.runtime import launch_config

# Activation kinds (constexpr selector), and the op each one serves.
SILU, GELU_ERF, GELU_TANH = 0, 1, 2
_OP_NAMES = {SILU: "silu_and_mul", GELU_ERF: "gelu_and_mul", GELU_TANH: "gelu_and_mul"}


@triton.jit
def _act_and_mul_kernel(
    x_ptr,
    x_stride,
    out_ptr,
    out_stride,
    n_rows,
    d,
    ACT: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ROWS: tl.constexpr,
    COLS_FIRST: tl.constexpr,
    EVEN: tl.constexpr,
):
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
    mask = None if EVEN else (rows < n_rows)[:, None] & (cols < d)[None, :]
    x_rows = x_ptr + rows[:, None] * x_stride + cols[None, :]
    if EVEN:
        g = tl.load(x_rows).to(tl.float32)
        u = tl.load(x_rows + d).to(tl.float32)
    else:
        g = tl.load(x_rows, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_rows + d, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        a = g * tl.sigmoid(g)
    elif ACT == 1:
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    else:
        # tanh(y) = 1 - 2 / (exp(2y) + 1): exact in fp32 and available in the interpreter.
        y = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = 1.0 - 2.0 / (tl.exp(2.0 * y) + 1.0)
        a = 0.5 * g * (1.0 + t)
    tl.store(
        out_ptr + rows[:, None] * out_stride + cols[None, :],
        (a * u).to(out_ptr.dtype.element_ty),
        mask=mask,
    )


def tiles_cover(n_rows: int, d: int, rows: int, block_c: int) -> bool:
    """Whether ``[rows, block_c]`` tiles cover a ``[n_rows, d]`` output exactly: the
    kernel's ``EVEN``, its loads and stores unmasked."""
    return d % block_c == 0 and n_rows % rows == 0


def _act_and_mul(x: torch.Tensor, act: int, shape: tuple) -> torch.Tensor:
    d = x.shape[-1] // 2
    out = _bound.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    n_rows = out.numel() // d if d else 0
    if n_rows == 0:
        return out
    stride = require_row_stride(x, f"{_OP_NAMES[act]}: x")
    # A tuned choice for this size (docs/tuning.md), else the launch model (_launch).
    cfg = launch_config(_OP_NAMES[act], PROVIDER, x.dtype, n_rows, shape)
    if cfg is None:
        sms = _launch.multiprocessors(x.device.index)
        block_c, rows, warps, cols_first = _launch.gated_params(n_rows, d, sms)
    else:
        block_c, rows, warps = cfg["BLOCK_C"], cfg["ROWS"], cfg["num_warps"]
        cols_first = cfg["COLS_FIRST"]
    row_blocks, col_tiles = _launch.cdiv(n_rows, rows), _launch.cdiv(d, block_c)
    grid = (row_blocks * col_tiles,) if cols_first else (row_blocks, col_tiles)
    _bound.launch(
        _act_and_mul_kernel,
        grid,
        x,
        stride,
        out,
        d,
        n_rows,
        d,
        ACT=act,
        BLOCK_C=block_c,
        ROWS=rows,
        COLS_FIRST=bool(cols_first),
        EVEN=tiles_cover(n_rows, d, rows, block_c),
        num_warps=warps,
    )
    return out


def silu_and_mul(x):
    """`silu_and_mul` on a Triton device: ``silu(x[..., :d]) * x[..., d:]``."""
    return _act_and_mul(x, SILU, (x.shape[-1] // 2,))


def gelu_and_mul(x, approximate="none"):
    """`gelu_and_mul` on a Triton device; ``approximate`` is ``"none"`` (erf) or ``"tanh"``."""
    if approximate == "none":
        return _act_and_mul(x, GELU_ERF, (x.shape[-1] // 2, approximate))
    if approximate == "tanh":
        return _act_and_mul(x, GELU_TANH, (x.shape[-1] // 2, approximate))
    raise ValueError(f"gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
