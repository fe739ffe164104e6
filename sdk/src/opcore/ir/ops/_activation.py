"""``silu_and_mul`` and ``gelu_and_mul``: gated activations over the halves of the last dim.

``d = x.shape[-1] // 2``; ``silu(x[..., :d]) * x[..., d:]`` and
``gelu(x[..., :d], approximate) * x[..., d:]``, computed in fp32 (fp64 for fp64 inputs) and
cast back once. The last dim must be even.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opcore.ir.op import register_op
from opcore.ir.ops import _checks as c
from opcore.ir.samples import SampleInput, randn

GELU_APPROXIMATIONS = ("none", "tanh")


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@register_op
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` with ``d = x.shape[-1] // 2``."""
    d = x.shape[-1] // 2
    xf = x.to(_acc(x.dtype))
    return (F.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype).contiguous()


# fp32 exact gelu computes 1 + erf(x / sqrt(2)), which cancels for negative gates: its
# absolute error is about |gate| * |up| * 6e-8, so gates and ups of magnitude ~40 (the
# large_magnitude sample) reach 1e-4 in float32 against a float64 reference.
_GELU_TOLERANCES = {torch.float32: (1e-4, 1.3e-6)}


@register_op(tolerances=_GELU_TOLERANCES)
def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``gelu(x[..., :d], approximate) * x[..., d:]`` with ``d = x.shape[-1] // 2``."""
    d = x.shape[-1] // 2
    xf = x.to(_acc(x.dtype))
    return (F.gelu(xf[..., :d], approximate=approximate) * xf[..., d:]).to(x.dtype).contiguous()


# Validators as `_checks` says: each rule one condition; a failing one raises via a helper.
@silu_and_mul.register_validator
def _validate_silu_and_mul(x):
    try:
        if x.dtype not in c.FLOAT_SET or not x.ndim or x.shape[-1] % 2:
            _bad_gated("silu_and_mul", x)
    except AttributeError:
        c.not_tensors("silu_and_mul", x=x)
        raise


@gelu_and_mul.register_validator
def _validate_gelu_and_mul(x, approximate="none"):
    try:
        if x.dtype not in c.FLOAT_SET or not x.ndim or x.shape[-1] % 2:
            _bad_gated("gelu_and_mul", x)
    except AttributeError:
        c.not_tensors("gelu_and_mul", x=x)
        raise
    if approximate not in GELU_APPROXIMATIONS:
        c.fail("gelu_and_mul", "approximate", f"is {approximate!r}; expected 'none' or 'tanh'")


def _bad_gated(op: str, x) -> None:
    if x.dtype in c.FLOAT_SET and x.ndim:
        c.fail(op, "x", f"last dim is {x.shape[-1]}; it must be even (gate half, up half)")
    c.bad_float(op, "x", x)


@silu_and_mul.register_fake
def _silu_and_mul_fake(x):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@gelu_and_mul.register_fake
def _gelu_and_mul_fake(x, approximate="none"):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _gated_samples(dtype, quick, generator):
    """(name, x): 1 token, odd and prime halves, halves around vector widths, 2-D to 4-D,
    strided rows, zero rows and large magnitudes."""
    yield "t1_d8", randn((1, 16), dtype, generator)
    halves = (
        (1, 7, 31, 32, 33, 127, 128, 129)
        if quick
        else (1, 3, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1031)
    )
    for d in halves:
        yield f"t5_d{d}", randn((5, 2 * d), dtype, generator)
    yield "t11_d211_prime", randn((11, 422), dtype, generator)
    yield "3d_2x3x64", randn((2, 3, 64), dtype, generator)
    yield "4d_2x2x3x40", randn((2, 2, 3, 40), dtype, generator)
    buf = randn((6, 3 * 96), dtype, generator)
    yield "strided_rows_t6_d48", buf[:, 96:192]
    z = randn((4, 64), dtype, generator)
    z[1] = 0
    yield "zero_rows_t4_d32", z
    yield "large_magnitude_t4_d32", randn((4, 64), dtype, generator, scale=40.0)
    if not quick:
        yield "t256_d11008", randn((256, 2 * 11008), dtype, generator)
        yield "t1_d14336", randn((1, 2 * 14336), dtype, generator)


@silu_and_mul.register_sample_inputs
def _silu_and_mul_samples(dtype, *, quick, generator):
    for name, x in _gated_samples(dtype, quick, generator):
        yield SampleInput(name, (x,))


@gelu_and_mul.register_sample_inputs
def _gelu_and_mul_samples(dtype, *, quick, generator):
    for name, x in _gated_samples(dtype, quick, generator):
        yield SampleInput(name, (x,))
        yield SampleInput(name + "_tanh", (x,), {"approximate": "tanh"})
