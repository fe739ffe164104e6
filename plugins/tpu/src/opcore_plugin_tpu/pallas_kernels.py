"""Pallas (JAX) kernels for the TPU. Imports JAX: import this module only where JAX is
installed (a TPU host with ``opcore-plugin-tpu[tpu]``, or a venv checking the kernels in
Pallas' interpreter).

``rms_norm(x, weight, epsilon=..., variance_size=..., block_rows=..., interpret=False)``
takes a 2-D ``[rows, hidden]`` array (and a ``[1, hidden]`` weight or ``None``) and follows
`opcore.ir.ops.rms_norm`: fp32 math, ``x * rsqrt(mean(x[:, :variance_size]**2) + eps)``,
times the weight, cast back to ``x``'s dtype. Each program normalises ``block_rows`` full
rows, so the block's last dim is the whole hidden size (always a legal TPU block) and
``block_rows`` is a multiple of 8 or all the rows (the TPU's sublane tiling).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _rms_norm_kernel(*refs, epsilon: float, variance_size: int | None, has_weight: bool):
    if has_weight:
        x_ref, w_ref, o_ref = refs
    else:
        (x_ref, o_ref), w_ref = refs, None
    x = x_ref[...].astype(jnp.float32)
    xv = x if variance_size is None else x[:, :variance_size]
    inv = jax.lax.rsqrt(jnp.mean(xv * xv, axis=-1, keepdims=True) + epsilon)
    y = x * inv
    if w_ref is not None:
        y = y * w_ref[...].astype(jnp.float32)
    o_ref[...] = y.astype(o_ref.dtype)


def pick_block_rows(rows: int, hidden: int, itemsize: int, budget_bytes: int = 2 << 20) -> int:
    """Rows per program: all rows when fewer than 8, else a multiple of 8 whose fp32
    working copy fits ``budget_bytes`` (a fraction of a TPU core's VMEM)."""
    if rows < 8:
        return rows
    per_row = hidden * max(itemsize, 4) * 3  # input, fp32 copy, output
    fit = max(8, (budget_bytes // per_row) // 8 * 8)
    return min(fit, (rows + 7) // 8 * 8, 512)


@functools.partial(jax.jit, static_argnames=("epsilon", "variance_size", "block_rows", "interpret"))
def rms_norm(
    x,
    weight,
    *,
    epsilon: float,
    variance_size: int | None,
    block_rows: int,
    interpret: bool = False,
):
    rows, hidden = x.shape
    has_weight = weight is not None
    kernel = functools.partial(
        _rms_norm_kernel, epsilon=epsilon, variance_size=variance_size, has_weight=has_weight
    )
    row_block = pl.BlockSpec((block_rows, hidden), lambda i: (i, 0))
    in_specs = [row_block]
    operands = [x]
    if has_weight:
        in_specs.append(pl.BlockSpec((1, hidden), lambda i: (0, 0)))
        operands.append(weight)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(pl.cdiv(rows, block_rows),),
        in_specs=in_specs,
        out_specs=row_block,
        interpret=interpret,
    )(*operands)
