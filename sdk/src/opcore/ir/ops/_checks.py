"""What the built-in ops' validators share: the rules' building blocks and their messages.

How a validator is written (one definition per rule, fast by construction): it is one
straight-line function in which every rule is a single condition on argument metadata,
written once, and a failing condition calls one of the ``bad_*`` helpers below. A helper
runs only on failure: it works out which part of the rule the argument broke and raises a
``ValueError`` (``TypeError`` for a wrong Python type) whose message names the op, the
argument and what was expected. Helpers never accept: whatever they find, they raise, so
the condition alone decides what is valid and a valid call pays only its comparisons (the
validator runs on every eager call). A non-tensor where a tensor is expected shows up as
an ``AttributeError`` in a condition; the validator turns it into a ``TypeError`` with
`not_tensors`.

Only metadata is read, except `check_position_values` and `check_index_values`, which read
position or index values when that is cheap and safe (see `values_readable`).
"""

from __future__ import annotations

import itertools
import os
from typing import NoReturn

import torch

from opcore.env import FLAG_ON

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLOAT_SET = frozenset(FLOAT_DTYPES)
INDEX_DTYPES = (torch.int32, torch.int64)
INDEX_SET = frozenset(INDEX_DTYPES)
# ``0.0 <= eps < INF`` is False for a negative, NaN or infinite epsilon: the one comparison
# `eps_ok` makes for a float epsilon.
INF = float("inf")
SymInt = torch.SymInt
SymFloat = torch.SymFloat
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
# OPCORE_IR_CHECK_VALUES=1 reads positions on every device (a device sync per call). Read
# at import with the switch values every core switch accepts; a bad value is reported, one
# line naming it, when the config is created (opcore.settings.check_environment).
_CHECK_ALL_DEVICES = os.environ.get("OPCORE_IR_CHECK_VALUES", "").strip().lower() in FLAG_ON


# --------------------------------------------------------------------------- messages
def fail(op: str, arg: str, message: str) -> NoReturn:
    raise ValueError(f"opcore.ir.ops.{op}: argument {arg!r}: {message}")


def wrong_type(op: str, arg: str, value: object, expected: str) -> NoReturn:
    raise TypeError(
        f"opcore.ir.ops.{op}: argument {arg!r}: expected {expected}, got {type(value).__name__}"
    )


def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _tensor(op: str, arg: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        wrong_type(op, arg, t, "a Tensor")
    return t


def not_tensors(op: str, **named: object) -> None:
    """A condition met an object without tensor attributes: raise a ``TypeError`` naming
    the first of ``named`` (``None`` allowed: pass optional arguments here) that is not a
    tensor; return when all are (the caller re-raises what it caught)."""
    for arg, value in named.items():
        if value is not None:
            _tensor(op, arg, value)


def required_tensors(op: str, **named: object) -> None:
    """`not_tensors` for required arguments: ``None`` is not a tensor either, so a
    ``None`` in a required slot is a ``TypeError`` naming it, not an ``AttributeError``."""
    for arg, value in named.items():
        _tensor(op, arg, value)


def bad_float(
    op: str, arg: str, t: object, *, min_dim: int = 1, max_dim: int | None = None
) -> NoReturn:
    """``t`` is not a floating tensor with ``min_dim``..``max_dim`` dims."""
    t = _tensor(op, arg, t)
    if t.dtype not in FLOAT_SET:
        fail(
            op,
            arg,
            f"dtype {_dt(t)} is not supported; expected float16, bfloat16, float32 or float64",
        )
    if max_dim is None:
        expected = f"at least {min_dim}"
    elif max_dim == min_dim:
        expected = f"{min_dim}"
    else:
        expected = f"{min_dim} to {max_dim}"
    fail(op, arg, f"has {t.dim()} dims (shape {tuple(t.shape)}); expected {expected} dims")


def bad_like(
    op: str,
    arg: str,
    t: object,
    ref_arg: str,
    ref: torch.Tensor,
    *,
    dtype: bool = True,
    shape: tuple | None = None,
    shape_text: str = "",
) -> NoReturn:
    """``t`` is not a tensor on ``ref``'s device (with ``dtype``: of its dtype; with
    ``shape``: of that shape, ``shape_text`` saying why)."""
    t = _tensor(op, arg, t)
    if dtype and t.dtype != ref.dtype:
        fail(op, arg, f"dtype {_dt(t)} differs from {ref_arg!r} dtype {_dt(ref)}; they must match")
    if t.device != ref.device:
        fail(
            op,
            arg,
            f"is on {t.device} but {ref_arg!r} is on {ref.device}; they must be on one device",
        )
    fail(op, arg, f"has shape {tuple(t.shape)}; expected {shape}{shape_text}")


def bad_weight(
    op: str, arg: str, w: object, size: int, ref_arg: str, ref: torch.Tensor
) -> NoReturn:
    """``w`` is not a ``[size]`` tensor of ``ref``'s dtype on its device."""
    bad_like(
        op, arg, w, ref_arg, ref, shape=(size,), shape_text=f" to match the last dim of {ref_arg!r}"
    )


def bad_eps(op: str, arg: str, eps: object) -> NoReturn:
    """``eps`` is not a finite number >= 0 (a negative or NaN epsilon makes every output
    NaN, an infinite one every output 0)."""
    if isinstance(eps, bool) or not isinstance(eps, (float, int)):
        wrong_type(op, arg, eps, "a float")
    fail(op, arg, f"is {eps!r}; expected a finite number >= 0")


def bad_positive_int(
    op: str, arg: str, value: object, *, at_most: int | None = None, of: str = ""
) -> NoReturn:
    """``value`` is not an int in ``[1, at_most]``."""
    if isinstance(value, bool) or not isinstance(value, (int, SymInt)):
        wrong_type(op, arg, value, "an int")
    if value <= 0:
        fail(op, arg, f"is {value}; expected a positive int")
    fail(op, arg, f"is {value}, larger than {of} ({at_most})")


def bad_bool(op: str, arg: str, value: object) -> NoReturn:
    wrong_type(op, arg, value, "a bool")


# The rules several ops share, each written once here (`bad_eps` / `bad_weight` say what broke).
def eps_ok(eps: object) -> bool:
    """The epsilon rule: a finite float >= 0, an int >= 0, or a symbolic float while
    tracing (its value is not known here)."""
    return (
        (type(eps) is float and 0.0 <= eps < INF)
        or (type(eps) is int and eps >= 0)
        or isinstance(eps, SymFloat)
    )


def weight_ok(w: torch.Tensor, size: int, dtype: torch.dtype, device: torch.device) -> bool:
    """The weight rule: a 1-D tensor of ``size`` elements, of ``dtype``, on ``device``."""
    return w.dtype is dtype and w.ndim == 1 and w.numel() == size and w.device == device


def positive_int_ok(value: object) -> bool:
    """An int > 0 (not a bool), or a symbolic int while tracing."""
    return (type(value) is int and value > 0) or isinstance(value, SymInt)


# --------------------------------------------------------------------------- rope arguments
def heads_ok(t: torch.Tensor, lead: torch.Size, head_size: int) -> bool:
    """``t`` is ``[*lead, hidden]`` with ``hidden`` a multiple of ``head_size``, or
    ``[*lead, heads, head_size]``."""
    shape = t.shape
    n = len(lead)
    extra = len(shape) - n
    if shape[:n] != lead:
        return False
    if extra == 1:
        return shape[-1] % head_size == 0
    return extra == 2 and shape[-1] == head_size


def bad_heads(
    op: str,
    arg: str,
    t: object,
    positions: torch.Tensor,
    head_size: int,
    ref_arg: str,
    ref: torch.Tensor,
) -> NoReturn:
    """``t`` is not a tensor like ``ref`` that `heads_ok` accepts."""
    t = _tensor(op, arg, t)
    if t is not ref and (t.dtype != ref.dtype or t.device != ref.device):
        bad_like(op, arg, t, ref_arg, ref)
    if t is ref and t.dtype not in FLOAT_SET:
        bad_float(op, arg, t, min_dim=2)
    lead = positions.dim()
    if tuple(t.shape[:lead]) != tuple(positions.shape) or not 1 <= t.dim() - lead <= 2:
        fail(
            op,
            arg,
            f"has shape {tuple(t.shape)}; expected [*positions.shape, hidden] or "
            f"[*positions.shape, heads, head_size] with positions.shape {tuple(positions.shape)}",
        )
    if t.dim() - lead == 2:
        fail(op, arg, f"last dim {t.shape[-1]} is not head_size {head_size}")
    fail(op, arg, f"hidden size {t.shape[-1]} is not a multiple of head_size {head_size}")


def cache_ok(cache: torch.Tensor, head_size: int, dtype: torch.dtype, device: torch.device) -> bool:
    """``cache`` is ``[max_position, rotary_dim]`` in float32 or ``dtype``, on ``device``,
    with ``rotary_dim`` even, positive and at most ``head_size`` (cos half, sin half)."""
    cdt = cache.dtype
    if (cdt is not dtype and cdt is not torch.float32) or cache.ndim != 2 or cache.device != device:
        return False
    width = cache.shape[1]
    return 0 < width <= head_size and not width % 2


def bad_cache(op: str, cache: object, head_size: int, ref_arg: str, ref: torch.Tensor) -> NoReturn:
    """``cache`` is not what `cache_ok` accepts."""
    arg = "cos_sin_cache"
    cache = _tensor(op, arg, cache)
    if cache.dtype != ref.dtype and cache.dtype != torch.float32:
        fail(op, arg, f"dtype {_dt(cache)} must be float32 or {ref_arg!r} dtype {_dt(ref)}")
    if cache.device != ref.device:
        fail(
            op,
            arg,
            f"is on {cache.device} but {ref_arg!r} is on {ref.device}; they must be on one device",
        )
    if cache.dim() != 2:
        fail(op, arg, f"has shape {tuple(cache.shape)}; expected [max_position, rotary_dim]")
    width = cache.shape[1]
    if width == 0 or width % 2:
        fail(
            op,
            arg,
            f"width (rotary_dim) is {width}; it must be even and positive (cos half, sin half)",
        )
    fail(op, arg, f"width (rotary_dim) {width} is larger than head_size {head_size}")


def positions_ok(positions: torch.Tensor, device: torch.device) -> bool:
    """``positions`` is an int32/int64 ``[tokens]`` or ``[batch, seq]`` tensor on ``device``."""
    return positions.dtype in INDEX_SET and 1 <= positions.ndim <= 2 and positions.device == device


def bad_positions(op: str, positions: object, ref_arg: str, ref: torch.Tensor) -> NoReturn:
    """``positions`` is not what `positions_ok` accepts."""
    arg = "positions"
    positions = _tensor(op, arg, positions)
    if positions.dtype not in INDEX_SET:
        fail(op, arg, f"dtype {_dt(positions)} is not supported; expected int32 or int64")
    if positions.device != ref.device:
        fail(
            op,
            arg,
            f"is on {positions.device} but {ref_arg!r} is on {ref.device}; "
            "they must be on one device",
        )
    fail(op, arg, f"has shape {tuple(positions.shape)}; expected [tokens] or [batch, seq]")


def values_readable(t: torch.Tensor) -> bool:
    """Whether reading ``t``'s values is cheap and allowed: a plain CPU tensor (or any
    plain tensor with ``OPCORE_IR_CHECK_VALUES=1``) outside tracing."""
    return (
        type(t) is torch.Tensor
        and (t.is_cpu or _CHECK_ALL_DEVICES)
        and not _is_compiling()
        and not _dispatch_stack_len()
    )


def _value_range(t: torch.Tensor) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer tensor whose values are readable."""
    if t.numel() <= 64 and t.dim() <= 2:
        # A list beats a reduction for the few tokens of a decode step; tolist() of the
        # tensor itself, as reshape(-1) first costs more than the read (0.3 against 1.1 us).
        values = t.tolist()
        if t.dim() == 2:
            values = list(itertools.chain.from_iterable(values))
        elif t.dim() == 0:
            values = [values]
        return min(values), max(values)
    lo, hi = torch.aminmax(t)
    return int(lo), int(hi)


def check_index_values(op: str, arg: str, t: torch.Tensor, bound: int, of: str) -> None:
    """The integers of ``t`` lie in ``[0, bound)`` (``of`` names what they index); read only
    when `values_readable` (a plain CPU tensor): on a device, reading them would
    synchronise it on every call."""
    if t.numel() and values_readable(t):
        lo, hi = _value_range(t)
        if lo < 0 or hi >= bound:
            bad = hi if hi >= bound else lo
            fail(op, arg, f"holds {bad}, outside {of} [0, {bound})")


def check_position_values(op: str, positions: torch.Tensor, cache: torch.Tensor) -> None:
    """Positions lie in ``[0, cache rows)``; read only when `values_readable`."""
    if positions.numel() and values_readable(positions):
        lo, hi = _value_range(positions)
        max_pos = cache.shape[0]
        if lo < 0 or hi >= max_pos:
            bad = hi if hi >= max_pos else lo
            fail(
                op,
                "positions",
                f"holds position {bad}, outside the cos_sin_cache rows [0, {max_pos})",
            )
