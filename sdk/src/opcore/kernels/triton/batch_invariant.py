"""Provider ``triton_batch_invariant``: the reducing ops with a launch that ignores the row
count, so each row's bits do not depend on the batch (docs/properties.md).

The ``triton`` norms choose rows per program and warps from the number of rows (and a
tuning table may too), and a row's sum of squares is reduced in an order that follows that
layout. Here every program owns one row, with a tile and warp count that depend on the row
length alone: a row is reduced in the same order whether it is computed alone or among a
thousand others. The price is fewer rows per program for short rows and small batches
(bench/results: properties).

Ops: ``rms_norm``, ``fused_add_rms_norm`` and ``split_qkv_rmsnorm_rope`` (its per-head
norm by the same kernel on the heads as rows, kept in fp32, then the rotation in fp32 by
torch's elementwise kernels, cast once: the native function's rounding). The
elementwise ops need no variant: provider ``triton`` is batch-invariant for them.

Formula (rms_norm): ``y = x * rsqrt(sum(x[:v]**2) / v + eps) * weight``, fp32, cast once;
with a residual, ``s = x + r`` rounded to the input dtype is stored and normalised.

Registered by the platforms that import `opcore.kernels.triton` (after it), with the same
``supports_args`` as ``triton``; listed after ``triton`` in their default priority, so it
runs when a config requires ``batch_invariant`` (``OPCORE_BATCH_INVARIANT=1``).
"""

from __future__ import annotations

import torch

from opcore.ir import ops
from opcore.kernels.triton import HAS_TRITON, _register

PROVIDER = "triton_batch_invariant"
OPS = ("rms_norm", "fused_add_rms_norm", "split_qkv_rmsnorm_rope")
PROPERTIES = frozenset({"batch_invariant", "deterministic", "capture_safe"})

if HAS_TRITON:
    import triton
    import triton.language as tl

    from opcore.kernels.triton import _launch
    from opcore.kernels.triton._support import require_row_stride

    @triton.jit
    def _row_norm_kernel(
        x_ptr,
        x_stride,
        r_ptr,
        r_stride,
        w_ptr,
        out_ptr,
        out_stride,
        res_ptr,
        res_stride,
        n_cols,
        var_size,
        eps,
        heads,
        HAS_RESIDUAL: tl.constexpr,
        HAS_WEIGHT: tl.constexpr,
        BLOCK_N: tl.constexpr,
        N_CHUNKS: tl.constexpr,
    ):
        """One row per program: sum of squares over ``N_CHUNKS`` tiles of ``BLOCK_N``
        (both set by the row length), then the scaled row. Row ``i`` of ``x`` is head
        ``i % heads`` (``n_cols`` wide, adjacent) of token ``i // heads`` (``x_stride``
        apart); every other tensor is addressed by ``row * stride``."""
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + (row // heads) * x_stride + (row % heads) * n_cols
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c in tl.static_range(N_CHUNKS):
            cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                r = tl.load(r_ptr + row * r_stride + cols, mask=mask, other=0.0).to(tl.float32)
                s = (x + r).to(res_ptr.dtype.element_ty)
                tl.store(res_ptr + row * res_stride + cols, s, mask=mask)
                x = s.to(tl.float32)
            acc += tl.where(cols < var_size, x * x, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / var_size + eps)
        for c in tl.static_range(N_CHUNKS):
            cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            if HAS_RESIDUAL:
                x = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
            else:
                x = tl.load(x_row + cols, mask=mask, other=0.0)
            y = x.to(tl.float32) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _tile(n_cols: int) -> tuple[int, int, int]:
    """``(BLOCK_N, N_CHUNKS, num_warps)`` from the row length alone."""
    block = min(_launch.next_pow2(n_cols), _launch.CHUNK_COLS)
    return block, _launch.cdiv(n_cols, block), _launch.warps_for(block)


def _norm_rows(x2, r2, weight, out2, res2, epsilon, variance_size, heads: int = 1) -> None:
    """Launch the row kernel: ``out2`` (and ``r2``, ``res2``) are ``[rows, n]`` views with
    one row stride; ``x2`` is ``[tokens, heads * n]`` with one row stride."""
    n_rows, n_cols = out2.shape
    if n_rows == 0 or n_cols == 0:
        return
    block, chunks, warps = _tile(n_cols)
    has_res = r2 is not None
    _row_norm_kernel[(n_rows,)](
        x2,
        x2.stride(0),
        r2 if has_res else x2,
        r2.stride(0) if has_res else 0,
        weight if weight is not None else x2,
        out2,
        out2.stride(0),
        res2 if has_res else out2,
        res2.stride(0) if has_res else 0,
        n_cols,
        n_cols if variance_size is None else int(variance_size),
        float(epsilon),
        heads,
        HAS_RESIDUAL=has_res,
        HAS_WEIGHT=weight is not None,
        BLOCK_N=block,
        N_CHUNKS=chunks,
        num_warps=warps,
    )


def _rows(t: torch.Tensor, what: str) -> torch.Tensor:
    """``t`` as a 2-D ``[rows, last dim]`` view with one row stride (no copy)."""
    stride = require_row_stride(t, what)
    n = t.shape[-1]
    rows = t.numel() // n if n else 0
    return t.as_strided((rows, n), (stride, 1))


def rms_norm(x, weight, epsilon, variance_size=None):
    """`rms_norm`, one row per program: a new tensor shaped and typed like ``x``."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _norm_rows(
        _rows(x, "rms_norm: x"),
        None,
        weight,
        out.view(-1, x.shape[-1]),
        None,
        epsilon,
        variance_size,
    )
    return out


def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
    """`fused_add_rms_norm` into new tensors: ``(rms_norm(x + x_residual), x + x_residual)``."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.shape[-1]
    _norm_rows(
        _rows(x, "fused_add_rms_norm: x"),
        _rows(x_residual, "fused_add_rms_norm: x_residual"),
        weight,
        out.view(-1, n),
        res.view(-1, n),
        epsilon,
        variance_size,
    )
    return out, res


def _rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` columns of each head of ``t`` ([n, heads, d],
    fp32): NeoX pairs the two halves, GPT-J adjacent columns; the rest passes through."""
    rot = 2 * cos.shape[-1]
    head, rest = t[..., :rot], t[..., rot:]
    if is_neox:
        a, b = head[..., : rot // 2], head[..., rot // 2 :]
        rotated = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    else:
        a, b = head[..., 0::2], head[..., 1::2]
        rotated = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    return torch.cat((rotated, rest), dim=-1)


def split_qkv_rmsnorm_rope(
    qkv,
    q_weight,
    k_weight,
    epsilon,
    positions,
    cos_sin_cache,
    num_heads,
    num_kv_heads,
    head_size,
    is_neox,
):
    """`split_qkv_rmsnorm_rope`: per-head norms by the row kernel into fp32, rotation in
    fp32, one cast; ``v`` a contiguous copy."""
    lead = tuple(qkv.shape[:-1])
    n = positions.numel()
    qh, kh = num_heads * head_size, num_kv_heads * head_size
    flat = _rows(qkv, "split_qkv_rmsnorm_rope: qkv")
    cs = cos_sin_cache.index_select(0, positions.reshape(-1)).to(torch.float32)
    half = cs.shape[-1] // 2
    cos, sin = cs[:, None, :half], cs[:, None, half:]

    def norm_rope(lo: int, heads: int, weight) -> torch.Tensor:
        # each head of each token is one row of the kernel
        part = flat[:, lo : lo + heads * head_size]
        normed = torch.empty((n * heads, head_size), dtype=torch.float32, device=qkv.device)
        _norm_rows(part, None, weight, normed, None, epsilon, None, heads)
        rotated = _rope(normed.view(n, heads, head_size), cos, sin, is_neox)
        return rotated.to(qkv.dtype).reshape(*lead, heads * head_size)

    q = norm_rope(0, num_heads, q_weight)
    k = norm_rope(qh, num_kv_heads, k_weight)
    v = qkv[..., qh + kh :].clone(memory_format=torch.contiguous_format)
    return q, k, v


def register() -> None:
    """Register the provider on its three ops (idempotent), with ``triton``'s
    ``supports_args``; unsupported where Triton does not import."""
    kernels = {
        "rms_norm": (rms_norm, _register.supports_rms_norm),
        "fused_add_rms_norm": (fused_add_rms_norm, _register.supports_fused_add_rms_norm),
        "split_qkv_rmsnorm_rope": (
            split_qkv_rmsnorm_rope,
            _register.supports_split_qkv_rmsnorm_rope,
        ),
    }
    for name, (fn, supports) in kernels.items():
        op = getattr(ops, name)
        if PROVIDER in op.impls:
            continue
        op.register_impl(
            PROVIDER,
            supported=HAS_TRITON,
            supports_args=supports,
            properties=PROPERTIES,
            identity_sources=_register.IDENTITY_SOURCES,
        )(fn)


register()
