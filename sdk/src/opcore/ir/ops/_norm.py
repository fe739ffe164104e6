"""``rms_norm`` and ``fused_add_rms_norm``.

Semantics (fp32 math, or fp64 for fp64 inputs; cast back to the input dtype):
``rms_norm``: ``x * rsqrt(mean(x[..., :variance_size] ** 2) + epsilon) * weight`` over the
last dim (``variance_size=None``: all of it; ``weight=None``: no scale).
``fused_add_rms_norm``: ``residual = x + x_residual`` rounded to the input dtype, then
``(rms_norm(residual), residual)``.
"""

from __future__ import annotations

import torch

from opcore.ir.op import register_op
from opcore.ir.ops import _checks as c
from opcore.ir.samples import SampleInput, randn

_FLOAT = c.FLOAT_SET
_NORM_TOLERANCES = {torch.float16: (1e-2, 2e-3), torch.bfloat16: (2e-2, 1.6e-2)}


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rms(
    x: torch.Tensor, weight: torch.Tensor | None, epsilon: float, variance_size: int | None
) -> torch.Tensor:
    acc = _acc(x.dtype)
    xf = x.to(acc)
    xv = xf if variance_size is None else xf[..., :variance_size]
    out = xf * torch.rsqrt(xv.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    if weight is not None:
        out = out * weight.to(acc)
    return out.to(x.dtype).contiguous()


@register_op(tolerances=_NORM_TOLERANCES)
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None, epsilon: float, variance_size: int | None = None
) -> torch.Tensor:
    """RMS normalization over the last dim of ``x`` (see module docstring)."""
    return _rms(x, weight, epsilon, variance_size)


@register_op(allow_inplace=True, tolerances=_NORM_TOLERANCES)
def fused_add_rms_norm(
    x: torch.Tensor,
    x_residual: torch.Tensor,
    weight: torch.Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual = x + x_residual`` (in the input dtype); returns
    ``(rms_norm(residual, weight, epsilon, variance_size), residual)``."""
    residual = (x + x_residual).contiguous()
    return _rms(residual, weight, epsilon, variance_size), residual


# The validators follow the rule in `_checks`: each rule is one condition, written once; a
# failing one calls a helper that raises the message (a valid call pays only the compares).
# "x has a last dim" is the ``x.shape[-1]`` in the weight rule when there is a weight (an
# IndexError, turned into the message below) and ``x.ndim`` when there is none: a tensor
# attribute read costs ~50 ns, and this runs on every eager call.
@rms_norm.register_validator
def _validate_rms_norm(x, weight, epsilon, variance_size=None):
    try:
        dt = x.dtype
        if dt not in _FLOAT:
            c.bad_float("rms_norm", "x", x)
        if not c.eps_ok(epsilon):
            c.bad_eps("rms_norm", "epsilon", epsilon)
        if weight is not None:
            if not c.weight_ok(weight, x.shape[-1], dt, x.device):
                c.bad_weight("rms_norm", "weight", weight, x.shape[-1], "x", x)
        elif not x.ndim:
            c.bad_float("rms_norm", "x", x)
        if variance_size is not None and not _variance_ok(variance_size, x.shape[-1]):
            c.bad_positive_int(
                "rms_norm",
                "variance_size",
                variance_size,
                at_most=x.shape[-1],
                of="the last dim of 'x'",
            )
    except AttributeError:
        c.not_tensors("rms_norm", x=x, weight=weight)
        raise
    except IndexError:
        c.bad_float("rms_norm", "x", x)


@fused_add_rms_norm.register_validator
def _validate_fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
    op = "fused_add_rms_norm"
    try:
        dt = x.dtype
        if dt not in _FLOAT:
            c.bad_float(op, "x", x)
        if not c.eps_ok(epsilon):
            c.bad_eps(op, "epsilon", epsilon)
        if not (
            x_residual.dtype is dt and x_residual.shape == x.shape and x_residual.device == x.device
        ):
            c.bad_like(
                op, "x_residual", x_residual, "x", x, shape=tuple(x.shape), shape_text=" like 'x'"
            )
        if weight is not None:
            if not c.weight_ok(weight, x.shape[-1], dt, x.device):
                c.bad_weight(op, "weight", weight, x.shape[-1], "x", x)
        elif not x.ndim:
            c.bad_float(op, "x", x)
        if variance_size is not None and not _variance_ok(variance_size, x.shape[-1]):
            c.bad_positive_int(
                op, "variance_size", variance_size, at_most=x.shape[-1], of="the last dim of 'x'"
            )
    except AttributeError:
        c.not_tensors(op, x=x, x_residual=x_residual, weight=weight)
        raise
    except IndexError:
        c.bad_float(op, "x", x)


def _variance_ok(variance_size, hidden) -> bool:
    return (
        type(variance_size) is int or isinstance(variance_size, c.SymInt)
    ) and 0 < variance_size <= hidden


@rms_norm.register_fake
def _rms_norm_fake(x, weight, epsilon, variance_size=None):
    return x.new_empty(x.shape)


@fused_add_rms_norm.register_fake
def _fused_add_rms_norm_fake(x, x_residual, weight, epsilon, variance_size=None):
    return x.new_empty(x.shape), x.new_empty(x.shape)


# --------------------------------------------------------------------------- samples
def _shapes(quick: bool):
    """(name, shape, options): 1 token, odd and prime sizes, sizes around vector widths,
    2-D to 4-D, strided rows, no weight, partial variance, special values."""
    yield "t1_h8", (1, 8), {}
    yield "t1_h4096", (1, 4096), {}
    for h in (
        (7, 31, 32, 33, 127, 128, 129)
        if quick
        else (
            1,
            7,
            15,
            16,
            17,
            31,
            32,
            33,
            63,
            64,
            65,
            127,
            128,
            129,
            255,
            256,
            257,
            1023,
            1024,
            1031,
        )
    ):
        yield f"t5_h{h}", (5, h), {}
    yield "t13_h251_prime", (13, 251), {}
    yield "3d_2x3x64", (2, 3, 64), {}
    yield "4d_2x2x3x40", (2, 2, 3, 40), {}
    yield "strided_rows_t6_h96", (6, 96), {"strided": True}
    yield "strided_rows_t1_h33", (1, 33), {"strided": True}
    yield "weight_none_t4_h48", (4, 48), {"weight": False}
    yield "variance_size_t4_h64_v32", (4, 64), {"variance_size": 32}
    yield "variance_size_t3_h65_v33", (3, 65), {"variance_size": 33}
    yield "zero_rows_t4_h32", (4, 32), {"zero_rows": True}
    yield "large_magnitude_t4_h64", (4, 64), {"scale": 1000.0}
    if not quick:
        yield "t256_h4096", (256, 4096), {}
        yield "t33_h5120", (33, 5120), {}
        yield "4d_strided_2x4x8x128", (2, 4, 8, 128), {"strided": True}


def _activation(shape, dtype, g, opts):
    scale = opts.get("scale", 1.0)
    if opts.get("strided"):
        # rows of a wider buffer: the row stride is 3x the row length (like q of a QKV buffer)
        buf = randn((*shape[:-1], 3 * shape[-1]), dtype, g, scale=scale)
        x = buf[..., shape[-1] : 2 * shape[-1]]
    else:
        x = randn(shape, dtype, g, scale=scale)
    if opts.get("zero_rows"):
        x[..., ::2, :] = 0
    return x


def _weight(shape, dtype, g, opts):
    if opts.get("weight", True) is False:
        return None
    return (1.0 + 0.5 * randn((shape[-1],), torch.float32, g)).to(dtype)


@rms_norm.register_sample_inputs
def _rms_norm_samples(dtype, *, quick, generator):
    for name, shape, opts in _shapes(quick):
        x = _activation(shape, dtype, generator, opts)
        w = _weight(shape, dtype, generator, opts)
        yield SampleInput(name, (x, w, 1e-6, opts.get("variance_size")))
    yield SampleInput(
        "eps_1e-2_kwargs", (randn((3, 24), dtype, generator),), {"weight": None, "epsilon": 1e-2}
    )


@fused_add_rms_norm.register_sample_inputs
def _fused_add_rms_norm_samples(dtype, *, quick, generator):
    for name, shape, opts in _shapes(quick):
        x = _activation(shape, dtype, generator, opts)
        r = _activation(shape, dtype, generator, {**opts, "zero_rows": False})
        w = _weight(shape, dtype, generator, opts)
        yield SampleInput(name, (x, r, w, 1e-6, opts.get("variance_size")))
