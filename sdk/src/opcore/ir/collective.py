"""The collective ops: ``all_reduce`` and ``fused_all_reduce_add_rms_norm``.

Semantics (``group`` names a process group registered with `opcore.distributed`; every
rank of it calls the op with its own ``x`` and the same other arguments):

``all_reduce(x, group)``: ``sum over ranks r of x_r``, in ``x``'s dtype and shape, a new
tensor (``x`` unchanged); every rank gets bitwise the same result.

``fused_all_reduce_add_rms_norm(x, residual, weight, epsilon, group)``:
``h = all_reduce(x, group) + residual`` rounded to the input dtype, then
``(rms_norm(h, weight, epsilon), h)``, i.e. ``fused_add_rms_norm(all_reduce(x), residual,
weight, epsilon)``: the end of a tensor-parallel decoder block. The native provider is that
composition (the communicator's all-reduce, then the ``fused_add_rms_norm`` op with its own
provider priority), so it is bitwise equal to the unfused sequence; a fusing provider may
sum in another order or precision (docs/distributed.md, summation order).

They are registered with ``collective=True``: `opcore.ir.collective_ops()` lists them,
single-process checks leave them out, and ``opcore conformance --world-size N`` checks
them across N processes.
"""

from __future__ import annotations

import torch

from opcore.distributed.groups import get_communicator
from opcore.ir.op import register_op
from opcore.ir.ops import _checks as c
from opcore.ir.ops import fused_add_rms_norm

_FLOAT = c.FLOAT_SET
_NORM_TOLERANCES = {torch.float16: (1e-2, 2e-3), torch.bfloat16: (2e-2, 1.6e-2)}


@register_op(collective=True, allow_inplace=True)
def all_reduce(x: torch.Tensor, group: str) -> torch.Tensor:
    """Sum of ``x`` over the ranks of process group ``group`` (a registered name); a new
    tensor, bitwise the same on every rank."""
    return get_communicator(group).all_reduce(x)


@register_op(
    collective=True,
    allow_inplace=True,
    activations=("x", "residual"),
    tolerances=_NORM_TOLERANCES,
)
def fused_all_reduce_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    epsilon: float,
    group: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = all_reduce(x, group) + residual`` (in the input dtype); returns
    ``(rms_norm(h, weight, epsilon), h)``."""
    reduced = get_communicator(group).all_reduce(x)
    return fused_add_rms_norm(reduced, residual, weight, epsilon)


# ``in_place``: the same computation with the caller's activations donated
# (``maybe_inplace``): the all-reduce writes into ``x`` instead of a copy, and the add +
# RMSNorm runs through ``fused_add_rms_norm.maybe_inplace``. The default overload uses the
# native function (``functional=``), so selecting it never costs a copy more than native.
# Listed by no platform: put it first in a priority (``set_priority``,
# ``OPCORE_IR_OP_PRIORITY``, a platform default) where the caller donates its buffers.
@all_reduce.register_impl("in_place", inplace=True, functional=all_reduce.native)
def all_reduce_in_place(x: torch.Tensor, group: str) -> torch.Tensor:
    return get_communicator(group).all_reduce_(x)


@fused_all_reduce_add_rms_norm.register_impl(
    "in_place", inplace=True, functional=fused_all_reduce_add_rms_norm.native
)
def fused_all_reduce_add_rms_norm_in_place(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    epsilon: float,
    group: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    reduced = get_communicator(group).all_reduce_(x)
    return fused_add_rms_norm.maybe_inplace(reduced, residual, weight, epsilon)


def _bad_group(op: str, group: object) -> None:
    if not isinstance(group, str):
        c.wrong_type(op, "group", group, "a registered process group name (str)")
    c.fail(op, "group", "expected a registered process group name, got an empty string")


@all_reduce.register_validator
def _validate_all_reduce(x, group):
    try:
        if x.dtype not in _FLOAT:
            c.bad_float("all_reduce", "x", x)
    except AttributeError:
        c.not_tensors("all_reduce", x=x)
        raise
    if not (type(group) is str and group):
        _bad_group("all_reduce", group)


@fused_all_reduce_add_rms_norm.register_validator
def _validate_fused_all_reduce_add_rms_norm(x, residual, weight, epsilon, group):
    op = "fused_all_reduce_add_rms_norm"
    try:
        dt = x.dtype
        if dt not in _FLOAT:
            c.bad_float(op, "x", x)
        if not c.eps_ok(epsilon):
            c.bad_eps(op, "epsilon", epsilon)
        if not (residual.dtype is dt and residual.shape == x.shape and residual.device == x.device):
            c.bad_like(
                op, "residual", residual, "x", x, shape=tuple(x.shape), shape_text=" like 'x'"
            )
        if weight is not None:
            if not c.weight_ok(weight, x.shape[-1], dt, x.device):
                c.bad_weight(op, "weight", weight, x.shape[-1], "x", x)
        elif not x.ndim:
            c.bad_float(op, "x", x)
    except AttributeError:
        c.not_tensors(op, x=x, residual=residual, weight=weight)
        raise
    except IndexError:
        c.bad_float(op, "x", x)
    if not (type(group) is str and group):
        _bad_group(op, group)


@all_reduce.register_fake
def _all_reduce_fake(x, group):
    return x.new_empty(x.shape)


@fused_all_reduce_add_rms_norm.register_fake
def _fused_all_reduce_add_rms_norm_fake(x, residual, weight, epsilon, group):
    return x.new_empty(x.shape), x.new_empty(x.shape)
