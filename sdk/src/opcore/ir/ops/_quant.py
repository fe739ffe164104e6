"""FP8 quantization ops, alone and fused into the RMSNorm or gated activation before them.

**Convention (reciprocal scale).** A scale maps fp8 codes back to values:
``q = sat(round(x / scale))`` and ``x ≈ q.float() * scale``. ``round`` is to the nearest
fp8 value, ties to even (subnormals included); ``sat`` clamps to ``±fp8_max`` (448 for
``float8_e4m3fn``, 240 for ``float8_e4m3fnuz``), so a finite input never becomes NaN or
infinity. NaN stays NaN.

**Non-finite values (one rule for every op).** Elementwise, ``x / scale`` is saturated:
``±inf`` becomes ``±fp8_max`` and NaN stays NaN (``sat`` does not touch NaN), with a
static scale as with a dynamic one. A dynamic scale is computed from the finite elements
only: ``amax`` is the largest ``|x|`` over the finite elements of the row (or group), 0
where there are none, so a NaN or an infinity changes neither the scale nor the codes of
the row's other elements, and every scale is finite and at least `MIN_SCALE`. For the
fused ops the rule applies to the norm's or activation's output, which follows IEEE
arithmetic: a NaN in a row makes its RMS, and so the whole normalised row, NaN; an
infinity makes the RMS infinite, so the normalised row is 0 with NaN (``inf * 0``) where
the infinity was; ``silu(-inf) = -inf * 0`` is NaN.

**Output dtype.** ``q`` is `opcore.ir.quant.fp8_dtype()`: the current platform's declared
``fp8_dtype`` (the ROCm plugin declares ``float8_e4m3fnuz`` on MI300), ``float8_e4m3fn``
where the platform declares none. Scales are float32.

**Scales.**

- static (``scale``): a float32 tensor of one element (shape ``[]`` or ``[1]``) on ``x``'s
  device, positive and finite (not checked: reading it would synchronise the device).
- dynamic per token: ``scales = max(min(amax, scale_ub) / fp8_max, MIN_SCALE)``, one per
  row (``amax``: the row's largest finite ``|x|``; ``scale_ub``: an optional float32
  one-element upper bound on ``amax``, so rows above it saturate), shape
  ``[*x.shape[:-1], 1]``.
- per token group: the same over each run of ``group_size`` columns (no upper bound),
  shape ``[*x.shape[:-1], H // group_size]``; with ``column_major_scales=True`` the same
  values laid out column-major, returned as the contiguous ``[H // group_size,
  *x.shape[:-1]]`` tensor (``scales.movedim(0, -1)`` is the row-major view).

The scale that divides is the float32 value returned, so ``q * scales`` reconstructs
exactly what was quantized. `MIN_SCALE` (2**-126, the smallest normal float32) keeps a row
of zeros at ``q = 0`` instead of ``0 / 0``, and keeps every scale and its reciprocal normal.

**Fused ops.** The norm + quant ops and `silu_and_mul_per_token_group_fp8_quant` are, by
definition, the unfused chain: the norm or activation output is rounded to ``x``'s dtype
exactly as `rms_norm`, `fused_add_rms_norm` or `silu_and_mul` return it, then quantized.
So ``rms_norm_static_fp8_quant(x, w, eps, s)`` equals ``scaled_fp8_quant(rms_norm(x, w,
eps), s)`` bit for bit in native, and a compile pass may rewrite one into the other
without changing the result; a fused kernel differs only in not writing the intermediate
to memory. `silu_and_mul_fp8_quant` rounds once: ``silu(gate) * up`` stays in fp32 (fp64
for fp64 inputs) and is quantized from there, so it equals
``scaled_fp8_quant(silu_and_mul(x.float()), s)`` bit for bit in native and differs from
the chain in ``x``'s dtype by that chain's rounding of the intermediate (one code on a
small fraction of elements while the intermediate is a normal number of ``x``'s dtype;
more where it is not: fp16's subnormals hold a few bits, fewer than e4m3's four).

**Math.** fp32 (fp64 for fp64 inputs): ``x`` and the scale are upcast, ``x / scale`` is
computed there, then saturated and rounded once to fp8.

**Tolerances** (`opcore.ir.tolerances.fp8_tolerance`): a provider's fp8 output may differ
from the float64 reference by at most one fp8 ULP (one code) on at most the declared
fraction of elements.
Why any at all: a kernel that multiplies by the reciprocal of the scale, or whose scale
differs from the reference's by a float32 ULP, moves values that sit on a rounding tie
by one code; and for the ops defined as their chain the reference does not round the
intermediate to the input dtype, which moves values near a tie after that rounding (about
2**-5 of them in bf16, 2**-7 in fp16; half of those land on the other side).
`silu_and_mul_fp8_quant` has no rounded intermediate, so only the scale's rounding
remains (fp32's budget for every input dtype); against its unfused chain (what the compile
fusion replaces, `opcore.ir.tolerances.fp8_chain_tolerance`) the chain's budget holds.
"""

from __future__ import annotations

import torch

from opcore.ir.op import register_op
from opcore.ir.ops import _checks as c
from opcore.ir.ops import _quant_samples as inputs
from opcore.ir.ops._activation import silu_and_mul
from opcore.ir.ops._norm import fused_add_rms_norm, rms_norm
from opcore.ir.quant import MIN_SCALE, fp8_dtype, fp8_max
from opcore.ir.samples import SampleInput, randn
from opcore.ir.tolerances import declare_fp8_tolerance

# {input dtype: (max fp8 ULPs, fraction of elements that may be off)}: see the module
# docstring. The scale's rounding (a reciprocal, a float32 ULP of a dynamic scale) may flip
# a tie: 1 % of the elements, for every input dtype. An intermediate rounded to the input
# dtype moves about 1.6 % (bf16) and 0.4 % (fp16) of them (power-of-two scales: twice
# that), which the ops defined as their chain add; fp32 and fp64 round no intermediate.
_SCALE_ROUNDING = 0.01
_INTERMEDIATE_ROUNDING = {
    torch.bfloat16: 0.03,
    torch.float16: 0.01,
    torch.float32: 0.0,
    torch.float64: 0.0,
}
FP8_TOLERANCES = {dt: (1, _SCALE_ROUNDING + f) for dt, f in _INTERMEDIATE_ROUNDING.items()}
# silu_and_mul_fp8_quant rounds once: no intermediate, only the scale's rounding.
FP8_TOLERANCES_ROUNDED_ONCE = {dt: (1, _SCALE_ROUNDING) for dt in _INTERMEDIATE_ROUNDING}


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _quantize(y: torch.Tensor, scale: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """``sat(round(y / scale))`` in ``fp8_dtype()``; ``y`` any float dtype, ``scale``
    broadcastable to it (float32 values)."""
    out = fp8_dtype()
    m = fp8_max(out)
    return (y.to(acc) / scale.to(acc)).clamp(-m, m).to(out).contiguous()


def _finite_amax(y: torch.Tensor) -> torch.Tensor:
    """The largest ``|y|`` over the finite elements of the last dim (0 where none is
    finite), kept as a dim of size 1: NaN and infinities do not enter a dynamic scale."""
    a = y.abs()
    return torch.where(torch.isfinite(a), a, 0).amax(dim=-1, keepdim=True)


def _dynamic_scales(
    amax: torch.Tensor, scale_ub: torch.Tensor | None, acc: torch.dtype
) -> torch.Tensor:
    """float32 ``max(min(amax, scale_ub) / fp8_max, MIN_SCALE)`` (``amax`` in ``acc``)."""
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.to(acc).reshape(()))
    return (amax / fp8_max(fp8_dtype())).clamp_min(MIN_SCALE).to(torch.float32)


def _per_token(y: torch.Tensor, scale_ub: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    acc = _acc(y.dtype)
    yf = y.to(acc)
    scales = _dynamic_scales(_finite_amax(yf), scale_ub, acc)
    return _quantize(yf, scales, acc), scales.contiguous()


def _per_group(
    y: torch.Tensor, group_size: int, column_major: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    acc = _acc(y.dtype)
    groups = y.shape[-1] // group_size
    yg = y.to(acc).reshape(*y.shape[:-1], groups, group_size)
    scales = _dynamic_scales(_finite_amax(yg), None, acc)
    q = _quantize(yg, scales, acc).reshape(y.shape)
    scales = scales.squeeze(-1)
    if column_major:
        scales = scales.movedim(-1, 0)
    return q, scales.contiguous()


# --------------------------------------------------------------------------- ops
@register_op
def scaled_fp8_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Static per-tensor quantization: ``sat(round(x / scale))`` in `fp8_dtype()`, shaped
    like ``x`` (``±inf`` -> ``±fp8_max``, NaN -> NaN). ``scale``: float32, one element;
    ``x ≈ q * scale``."""
    return _quantize(x, scale, _acc(x.dtype))


@register_op
def dynamic_per_token_scaled_fp8_quant(
    x: torch.Tensor, scale_ub: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token quantization: ``(q, scales)`` with ``scales[..., 0] =
    max(min(amax, scale_ub) / fp8_max, MIN_SCALE)``, ``amax`` the largest ``|x[..., j]|``
    over the row's finite elements (0 if none; float32, shape ``[*x.shape[:-1], 1]``) and
    ``q = sat(round(x / scales))`` (``±inf`` -> ``±fp8_max``, NaN -> NaN);
    ``x ≈ q * scales``."""
    return _per_token(x, scale_ub)


@register_op
def per_token_group_quant_fp8(
    x: torch.Tensor, group_size: int = 128, column_major_scales: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group quantization (blocks of ``group_size`` columns, the DeepSeek-style
    format): ``(q, scales)``, one float32 scale ``max(amax / fp8_max, MIN_SCALE)`` per
    group (``amax``: the largest ``|x|`` over the group's finite elements, 0 if none),
    ``scales`` shaped ``[*x.shape[:-1], H // group_size]`` (with
    ``column_major_scales``: ``[H // group_size, *x.shape[:-1]]``, contiguous) and
    ``q = sat(round(x / scale of its group))``."""
    return _per_group(x, group_size, column_major_scales)


@register_op
def rms_norm_static_fp8_quant(
    x: torch.Tensor, weight: torch.Tensor | None, epsilon: float, scale: torch.Tensor
) -> torch.Tensor:
    """``scaled_fp8_quant(rms_norm(x, weight, epsilon), scale)``: the normalised row is
    rounded to ``x``'s dtype, then ``sat(round(. / scale))``."""
    return _quantize(rms_norm.native(x, weight, epsilon), scale, _acc(x.dtype))


@register_op
def fused_add_rms_norm_static_fp8_quant(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    epsilon: float,
    scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, residual_out)``: ``residual_out = x + residual`` rounded to ``x``'s dtype and
    ``q = scaled_fp8_quant(rms_norm(residual_out, weight, epsilon), scale)``."""
    y, res = fused_add_rms_norm.native(x, residual, weight, epsilon)
    return _quantize(y, scale, _acc(x.dtype)), res


@register_op
def rms_norm_dynamic_per_token_quant(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    epsilon: float,
    residual: torch.Tensor | None = None,
    scale_ub: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(q, scales, residual_out)``: without ``residual``,
    ``dynamic_per_token_scaled_fp8_quant(rms_norm(x, weight, epsilon), scale_ub)`` and
    ``None``; with it, ``residual_out = x + residual`` (in ``x``'s dtype) is normalised and
    quantized the same way, and returned."""
    if residual is None:
        return (*_per_token(rms_norm.native(x, weight, epsilon), scale_ub), None)
    y, res = fused_add_rms_norm.native(x, residual, weight, epsilon)
    return (*_per_token(y, scale_ub), res)


@register_op
def silu_and_mul_fp8_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``sat(round(silu(x[..., :d]) * x[..., d:] / scale))`` with ``d = H // 2``, shape
    ``[*x.shape[:-1], d]``: computed in fp32 (fp64 for fp64 inputs) and rounded once, to
    fp8; the product is not rounded to ``x``'s dtype first. Bit for bit
    ``scaled_fp8_quant(silu_and_mul(x.to(acc)), scale)`` (``acc``: fp32, or fp64)."""
    acc = _acc(x.dtype)
    return _quantize(silu_and_mul.native(x.to(acc)), scale, acc)


@register_op
def silu_and_mul_per_token_group_fp8_quant(
    x: torch.Tensor, group_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_token_group_quant_fp8(silu_and_mul(x), group_size)`` (row-major scales);
    ``group_size`` divides ``H // 2``."""
    return _per_group(silu_and_mul.native(x), group_size, False)


QUANT_OPS = (
    scaled_fp8_quant,
    dynamic_per_token_scaled_fp8_quant,
    per_token_group_quant_fp8,
    rms_norm_static_fp8_quant,
    fused_add_rms_norm_static_fp8_quant,
    rms_norm_dynamic_per_token_quant,
    silu_and_mul_fp8_quant,
    silu_and_mul_per_token_group_fp8_quant,
)
for _op in QUANT_OPS:
    if _op is silu_and_mul_fp8_quant:
        # against its chain scaled_fp8_quant(silu_and_mul(x), s) (the compile fusion's
        # rewrite): the chain's rounding of the intermediate on top of its own budget
        declare_fp8_tolerance(_op.name, FP8_TOLERANCES_ROUNDED_ONCE, chain=FP8_TOLERANCES)
    else:
        declare_fp8_tolerance(_op.name, FP8_TOLERANCES)


# --------------------------------------------------------------------------- validators
# As `_checks` says: each rule one condition on metadata; a failing one raises via a helper.
def _scale_ok(s, x) -> bool:
    return s.dtype is torch.float32 and s.numel() == 1 and s.device == x.device


def _bad_scale(op: str, arg: str, s, x) -> None:
    if not isinstance(s, torch.Tensor):
        c.wrong_type(op, arg, s, "a float32 Tensor of one element")
    if s.dtype is not torch.float32:
        c.fail(op, arg, f"dtype {str(s.dtype).removeprefix('torch.')} is not float32")
    if s.numel() != 1:
        c.fail(op, arg, f"has shape {tuple(s.shape)}; expected one element (shape [] or [1])")
    c.fail(op, arg, f"is on {s.device} but 'x' is on {x.device}; they must be on one device")


def _check_x(op: str, x) -> None:
    if x.dtype not in c.FLOAT_SET or not x.ndim or not x.shape[-1]:
        if x.dtype in c.FLOAT_SET and x.ndim:
            c.fail(op, "x", "last dim is 0; expected at least one column")
        c.bad_float(op, "x", x)


def _check_gated(op: str, x) -> None:
    if x.dtype not in c.FLOAT_SET or not x.ndim or not x.shape[-1] or x.shape[-1] % 2:
        if x.dtype in c.FLOAT_SET and x.ndim:
            c.fail(op, "x", f"last dim is {x.shape[-1]}; it must be even and > 0 (gate, up halves)")
        c.bad_float(op, "x", x)


def _check_group(op: str, group_size, width: int, of: str) -> None:
    if not (c.positive_int_ok(group_size) and width % group_size == 0):
        if not c.positive_int_ok(group_size):
            c.bad_positive_int(op, "group_size", group_size)
        c.fail(op, "group_size", f"is {group_size}; it must divide {of} ({width})")


def _check_norm_args(op: str, x, weight, epsilon) -> None:
    _check_x(op, x)
    if not c.eps_ok(epsilon):
        c.bad_eps(op, "epsilon", epsilon)
    if weight is not None and not c.weight_ok(weight, x.shape[-1], x.dtype, x.device):
        c.bad_weight(op, "weight", weight, x.shape[-1], "x", x)


def _check_residual(op: str, residual, x) -> None:
    if not (
        residual.dtype is x.dtype and residual.shape == x.shape and residual.device == x.device
    ):
        c.bad_like(op, "residual", residual, "x", x, shape=tuple(x.shape), shape_text=" like 'x'")


@scaled_fp8_quant.register_validator
def _validate_scaled_fp8_quant(x, scale):
    op = "scaled_fp8_quant"
    try:
        _check_x(op, x)
        if not _scale_ok(scale, x):
            _bad_scale(op, "scale", scale, x)
    except AttributeError:
        c.not_tensors(op, x=x, scale=scale)
        raise


@dynamic_per_token_scaled_fp8_quant.register_validator
def _validate_dynamic_per_token(x, scale_ub=None):
    op = "dynamic_per_token_scaled_fp8_quant"
    try:
        _check_x(op, x)
        if scale_ub is not None and not _scale_ok(scale_ub, x):
            _bad_scale(op, "scale_ub", scale_ub, x)
    except AttributeError:
        c.not_tensors(op, x=x, scale_ub=scale_ub)
        raise


@per_token_group_quant_fp8.register_validator
def _validate_per_token_group(x, group_size=128, column_major_scales=False):
    op = "per_token_group_quant_fp8"
    try:
        _check_x(op, x)
        _check_group(op, group_size, x.shape[-1], "the last dim of 'x'")
    except AttributeError:
        c.not_tensors(op, x=x)
        raise
    if type(column_major_scales) is not bool:
        c.bad_bool(op, "column_major_scales", column_major_scales)


@rms_norm_static_fp8_quant.register_validator
def _validate_rms_norm_static(x, weight, epsilon, scale):
    op = "rms_norm_static_fp8_quant"
    try:
        _check_norm_args(op, x, weight, epsilon)
        if not _scale_ok(scale, x):
            _bad_scale(op, "scale", scale, x)
    except AttributeError:
        c.not_tensors(op, x=x, weight=weight, scale=scale)
        raise


@fused_add_rms_norm_static_fp8_quant.register_validator
def _validate_fused_add_rms_norm_static(x, residual, weight, epsilon, scale):
    op = "fused_add_rms_norm_static_fp8_quant"
    try:
        _check_norm_args(op, x, weight, epsilon)
        _check_residual(op, residual, x)
        if not _scale_ok(scale, x):
            _bad_scale(op, "scale", scale, x)
    except AttributeError:
        c.not_tensors(op, x=x, residual=residual, weight=weight, scale=scale)
        raise


@rms_norm_dynamic_per_token_quant.register_validator
def _validate_rms_norm_dynamic(x, weight, epsilon, residual=None, scale_ub=None):
    op = "rms_norm_dynamic_per_token_quant"
    try:
        _check_norm_args(op, x, weight, epsilon)
        if residual is not None:
            _check_residual(op, residual, x)
        if scale_ub is not None and not _scale_ok(scale_ub, x):
            _bad_scale(op, "scale_ub", scale_ub, x)
    except AttributeError:
        c.not_tensors(op, x=x, weight=weight, residual=residual, scale_ub=scale_ub)
        raise


@silu_and_mul_fp8_quant.register_validator
def _validate_silu_and_mul_fp8_quant(x, scale):
    op = "silu_and_mul_fp8_quant"
    try:
        _check_gated(op, x)
        if not _scale_ok(scale, x):
            _bad_scale(op, "scale", scale, x)
    except AttributeError:
        c.not_tensors(op, x=x, scale=scale)
        raise


@silu_and_mul_per_token_group_fp8_quant.register_validator
def _validate_silu_and_mul_group(x, group_size=128):
    op = "silu_and_mul_per_token_group_fp8_quant"
    try:
        _check_gated(op, x)
        _check_group(op, group_size, x.shape[-1] // 2, "half the last dim of 'x'")
    except AttributeError:
        c.not_tensors(op, x=x)
        raise


# --------------------------------------------------------------------------- fakes
def _q(x, shape=None):
    return x.new_empty(x.shape if shape is None else shape, dtype=fp8_dtype())


def _f32(x, shape):
    return x.new_empty(shape, dtype=torch.float32)


@scaled_fp8_quant.register_fake
def _scaled_fp8_quant_fake(x, scale):
    return _q(x)


@dynamic_per_token_scaled_fp8_quant.register_fake
def _dynamic_per_token_fake(x, scale_ub=None):
    return _q(x), _f32(x, (*x.shape[:-1], 1))


@per_token_group_quant_fp8.register_fake
def _per_token_group_fake(x, group_size=128, column_major_scales=False):
    groups = x.shape[-1] // group_size
    shape = (groups, *x.shape[:-1]) if column_major_scales else (*x.shape[:-1], groups)
    return _q(x), _f32(x, shape)


@rms_norm_static_fp8_quant.register_fake
def _rms_norm_static_fake(x, weight, epsilon, scale):
    return _q(x)


@fused_add_rms_norm_static_fp8_quant.register_fake
def _fused_add_rms_norm_static_fake(x, residual, weight, epsilon, scale):
    return _q(x), x.new_empty(x.shape)


@rms_norm_dynamic_per_token_quant.register_fake
def _rms_norm_dynamic_fake(x, weight, epsilon, residual=None, scale_ub=None):
    res = None if residual is None else x.new_empty(x.shape)
    return _q(x), _f32(x, (*x.shape[:-1], 1)), res


@silu_and_mul_fp8_quant.register_fake
def _silu_and_mul_fp8_quant_fake(x, scale):
    return _q(x, (*x.shape[:-1], x.shape[-1] // 2))


@silu_and_mul_per_token_group_fp8_quant.register_fake
def _silu_and_mul_group_fake(x, group_size=128):
    d = x.shape[-1] // 2
    return _q(x, (*x.shape[:-1], d)), _f32(x, (*x.shape[:-1], d // group_size))


# --------------------------------------------------------------------------- samples
# The activations, scales and shapes are drawn in `_quant_samples`.
@scaled_fp8_quant.register_sample_inputs
def _scaled_fp8_quant_samples(dtype, *, quick, generator):
    for name, shape, kind, strided in inputs.plain_shapes(quick):
        x = inputs.rows(shape, dtype, generator, kind, strided)
        scale = inputs.scale(
            inputs.HUGE * inputs.DEFAULT_SCALE if kind == "huge" else inputs.DEFAULT_SCALE
        )
        yield SampleInput(name, (x, scale))
    yield SampleInput(
        "scale_0d_t3_h24", (randn((3, 24), dtype, generator), inputs.scale(zero_dim=True))
    )
    yield SampleInput("scale_pow2_t4_h64", (randn((4, 64), dtype, generator), inputs.scale(0.0625)))
    yield SampleInput(
        "ties_t4_h64", (inputs.ties((4, 64), generator).to(dtype), inputs.scale(0.0625))
    )
    x = inputs.nonfinite_rows((6, 64), dtype, generator)
    yield SampleInput("nonfinite_rows_t6_h64", (x, inputs.scale()))


@dynamic_per_token_scaled_fp8_quant.register_sample_inputs
def _dynamic_per_token_samples(dtype, *, quick, generator):
    for name, shape, kind, strided in inputs.plain_shapes(quick):
        yield SampleInput(name, (inputs.rows(shape, dtype, generator, kind, strided),))
    x = inputs.rows((6, 64), dtype, generator)
    yield SampleInput("scale_ub_saturating_t6_h64", (x,), {"scale_ub": inputs.scale(1.0)})
    yield SampleInput(
        "scale_ub_above_t3_h32", (randn((3, 32), dtype, generator), inputs.scale(1e3))
    )
    x = inputs.nonfinite_rows((6, 64), dtype, generator)
    yield SampleInput("nonfinite_rows_t6_h64", (x,))
    yield SampleInput("nonfinite_rows_scale_ub_t6_h64", (x,), {"scale_ub": inputs.scale(1.0)})


@per_token_group_quant_fp8.register_sample_inputs
def _per_token_group_samples(dtype, *, quick, generator):
    for name, shape, gs, kind, strided in inputs.group_shapes(quick):
        x = inputs.rows(shape, dtype, generator, kind, strided)
        yield SampleInput(name, (x, gs))
        if not kind and not strided:
            yield SampleInput(name + "_column_major", (x, gs, True))
    x = inputs.rows((3, 256), dtype, generator)
    yield SampleInput("defaults_kwargs_t3_h256", (x,), {"column_major_scales": False})
    x = inputs.nonfinite_rows((6, 256), dtype, generator)
    yield SampleInput("nonfinite_rows_t6_h256_g64", (x, 64))
    yield SampleInput("nonfinite_rows_t6_h256_g64_column_major", (x, 64, True))


@rms_norm_static_fp8_quant.register_sample_inputs
def _rms_norm_static_samples(dtype, *, quick, generator):
    for name, shape, kind, strided, with_w in inputs.norm_shapes(quick):
        x = inputs.rows(shape, dtype, generator, kind, strided)
        w = inputs.norm_weight(shape[-1], dtype, generator, with_w)
        yield SampleInput(name, (x, w, 1e-6, inputs.norm_scale(kind)))
    x = randn((3, 24), dtype, generator)
    yield SampleInput(
        "eps_1e-2_kwargs", (x,), {"weight": None, "epsilon": 1e-2, "scale": inputs.scale()}
    )
    x = inputs.nonfinite_rows((6, 64), dtype, generator)
    w = inputs.norm_weight(64, dtype, generator)
    yield SampleInput("nonfinite_rows_t6_h64", (x, w, 1e-6, inputs.scale()))


@fused_add_rms_norm_static_fp8_quant.register_sample_inputs
def _fused_add_rms_norm_static_samples(dtype, *, quick, generator):
    for name, shape, kind, strided, with_w in inputs.norm_shapes(quick):
        x = inputs.rows(shape, dtype, generator, kind, strided)
        r = inputs.rows(shape, dtype, generator, "tiny" if kind == "tiny" else "", strided)
        w = inputs.norm_weight(shape[-1], dtype, generator, with_w)
        yield SampleInput(name, (x, r, w, 1e-6, inputs.norm_scale(kind)))
    x = inputs.nonfinite_rows((6, 64), dtype, generator)
    r = inputs.rows((6, 64), dtype, generator)
    w = inputs.norm_weight(64, dtype, generator)
    yield SampleInput("nonfinite_rows_t6_h64", (x, r, w, 1e-6, inputs.scale()))


@rms_norm_dynamic_per_token_quant.register_sample_inputs
def _rms_norm_dynamic_samples(dtype, *, quick, generator):
    for name, shape, kind, strided, with_w in inputs.norm_shapes(quick):
        x = inputs.rows(shape, dtype, generator, kind, strided)
        w = inputs.norm_weight(shape[-1], dtype, generator, with_w)
        yield SampleInput(name, (x, w, 1e-6))
        r = inputs.rows(shape, dtype, generator, "", strided)
        yield SampleInput(name + "_residual", (x, w, 1e-6, r))
    x = inputs.rows((6, 64), dtype, generator)
    w = inputs.norm_weight(64, dtype, generator)
    yield SampleInput("scale_ub_saturating_t6_h64", (x, w, 1e-6), {"scale_ub": inputs.scale(1.0)})
    r = inputs.rows((6, 64), dtype, generator)
    yield SampleInput(
        "scale_ub_residual_kwargs_t6_h64",
        (x, w, 1e-6),
        {"residual": r, "scale_ub": inputs.scale(1.5)},
    )
    x = inputs.nonfinite_rows((6, 64), dtype, generator)
    w = inputs.norm_weight(64, dtype, generator)
    yield SampleInput("nonfinite_rows_t6_h64", (x, w, 1e-6))
    r = inputs.rows((6, 64), dtype, generator)
    yield SampleInput("nonfinite_rows_t6_h64_residual", (x, w, 1e-6, r))


@silu_and_mul_fp8_quant.register_sample_inputs
def _silu_and_mul_fp8_quant_samples(dtype, *, quick, generator):
    for name, shape, kind, strided in inputs.gated_shapes(quick):
        x = inputs.rows(shape, dtype, generator, kind, strided)
        yield SampleInput(name, (x, inputs.scale()))
    # the op rounds once (fp32), so a product below fp16's normal range is exact enough
    # here; the chain in fp16 would hold it with a few bits, several codes off
    x = inputs.rows((4, 128), dtype, generator, "tiny_gated")
    yield SampleInput("tiny_t4_d64", (x, inputs.scale(inputs.TINY_GATED_SCALE)))
    yield SampleInput(
        "nonfinite_rows_t6_d64",
        (inputs.nonfinite_rows((6, 128), dtype, generator, gated=True), inputs.scale()),
    )


@silu_and_mul_per_token_group_fp8_quant.register_sample_inputs
def _silu_and_mul_group_samples(dtype, *, quick, generator):
    for name, shape, gs, kind, strided in inputs.group_shapes(quick):
        if kind == "huge":
            name, kind = name.replace("huge", "large"), "large"
        elif kind == "tiny":
            name, kind = name.replace("tiny", "small"), "small"
        elif kind == "mixed":
            kind = "mixed_gated"
        x = inputs.rows((*shape[:-1], 2 * shape[-1]), dtype, generator, kind, strided)
        yield SampleInput(name, (x, gs))
    x = inputs.rows((3, 512), dtype, generator)
    yield SampleInput("default_group_t3_d256", (x,))
    x = inputs.nonfinite_rows((6, 512), dtype, generator, gated=True)
    yield SampleInput("nonfinite_rows_t6_d256_g64", (x, 64))
