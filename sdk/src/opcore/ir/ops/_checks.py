"""Argument checks shared by the built-in ops' validators.

Each raises ``ValueError`` (``TypeError`` for a wrong Python type) whose message names the
op, the argument and what was expected. Only metadata is read, except `check_positions`,
which reads position values when that is cheap and safe (see `values_readable`).
"""

from __future__ import annotations

import os

import torch

from opcore.config import FLAG_ON

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLOAT_SET = frozenset(FLOAT_DTYPES)
INDEX_DTYPES = (torch.int32, torch.int64)
INDEX_SET = frozenset(INDEX_DTYPES)
# ``0.0 <= eps < EPS_BOUND`` is False for a negative, NaN or infinite epsilon (the validators'
# fast paths use this one comparison; `check_eps` gives the message).
EPS_BOUND = float("inf")
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
# OPCORE_IR_CHECK_VALUES=1 reads positions on every device (a device sync per call). Read
# at import with the switch values every core switch accepts; a bad value is reported, one
# line naming it, when the config is created (opcore.config.check_environment).
_CHECK_ALL_DEVICES = os.environ.get("OPCORE_IR_CHECK_VALUES", "").strip().lower() in FLAG_ON


def fail(op: str, arg: str, message: str) -> None:
    raise ValueError(f"opcore.ir.ops.{op}: argument {arg!r}: {message}")


def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def check_tensor(op: str, arg: str, t: object) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"opcore.ir.ops.{op}: argument {arg!r}: expected a Tensor, got {type(t).__name__}")


def check_float(op: str, arg: str, t: torch.Tensor, *, min_dim: int = 1, max_dim: int | None = None) -> None:
    check_tensor(op, arg, t)
    if t.dtype not in FLOAT_DTYPES:
        fail(op, arg, f"dtype {_dt(t)} is not supported; expected float16, bfloat16, float32 or float64")
    if t.dim() < min_dim or (max_dim is not None and t.dim() > max_dim):
        expected = f"at least {min_dim}" if max_dim is None else f"{min_dim} to {max_dim}"
        fail(op, arg, f"has {t.dim()} dims (shape {tuple(t.shape)}); expected {expected}")


def check_like(op: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor, *, dtype: bool = True) -> None:
    """``t`` is a tensor on ``ref``'s device (and, with ``dtype``, of its dtype)."""
    check_tensor(op, arg, t)
    if dtype and t.dtype != ref.dtype:
        fail(op, arg, f"dtype {_dt(t)} differs from {ref_arg!r} dtype {_dt(ref)}; they must match")
    if t.device != ref.device:
        fail(op, arg, f"is on {t.device} but {ref_arg!r} is on {ref.device}; they must be on one device")


def check_weight(op: str, arg: str, w: torch.Tensor | None, size: int, ref_arg: str, ref: torch.Tensor) -> None:
    if w is None:
        return
    check_like(op, arg, w, ref_arg, ref)
    if w.dim() != 1 or w.shape[0] != size:
        fail(op, arg, f"has shape {tuple(w.shape)}; expected ({size},) to match the last dim of {ref_arg!r}")


def check_positive_int(op: str, arg: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
        raise TypeError(f"opcore.ir.ops.{op}: argument {arg!r}: expected an int, got {type(value).__name__}")
    if value <= 0:
        fail(op, arg, f"is {value}; expected a positive int")


def check_eps(op: str, arg: str, eps: object) -> None:
    """A finite number >= 0 (a negative or NaN epsilon makes every output NaN, an infinite
    one every output 0). A symbolic float's value is not known here and is not checked."""
    if isinstance(eps, bool) or not isinstance(eps, (float, int, torch.SymFloat)):
        raise TypeError(f"opcore.ir.ops.{op}: argument {arg!r}: expected a float, got {type(eps).__name__}")
    if not isinstance(eps, torch.SymFloat) and not 0.0 <= eps < EPS_BOUND:
        fail(op, arg, f"is {eps!r}; expected a finite number >= 0")


def values_readable(t: torch.Tensor) -> bool:
    """Whether reading ``t``'s values is cheap and allowed: a plain CPU tensor (or any
    plain tensor with ``OPCORE_IR_CHECK_VALUES=1``) outside tracing."""
    return (
        type(t) is torch.Tensor
        and (t.is_cpu or _CHECK_ALL_DEVICES)
        and not _is_compiling()
        and not _dispatch_stack_len()
    )


def check_cache(op: str, cache: torch.Tensor, head_size: int, ref_arg: str, ref: torch.Tensor) -> None:
    arg = "cos_sin_cache"
    check_tensor(op, arg, cache)
    if cache.dtype != ref.dtype and cache.dtype != torch.float32:
        fail(op, arg, f"dtype {_dt(cache)} must be float32 or {ref_arg!r} dtype {_dt(ref)}")
    if cache.device != ref.device:
        fail(op, arg, f"is on {cache.device} but {ref_arg!r} is on {ref.device}; they must be on one device")
    if cache.dim() != 2:
        fail(op, arg, f"has shape {tuple(cache.shape)}; expected [max_position, rotary_dim]")
    width = cache.shape[1]
    if width == 0 or width % 2:
        fail(op, arg, f"width (rotary_dim) is {width}; it must be even and positive (cos half, sin half)")
    if width > head_size:
        fail(op, arg, f"width (rotary_dim) {width} is larger than head_size {head_size}")


def check_positions(op: str, positions: torch.Tensor, cache: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    arg = "positions"
    check_tensor(op, arg, positions)
    if positions.dtype not in INDEX_DTYPES:
        fail(op, arg, f"dtype {_dt(positions)} is not supported; expected int32 or int64")
    if positions.device != ref.device:
        fail(op, arg, f"is on {positions.device} but {ref_arg!r} is on {ref.device}; they must be on one device")
    if not 1 <= positions.dim() <= 2:
        fail(op, arg, f"has shape {tuple(positions.shape)}; expected [tokens] or [batch, seq]")
    check_position_values(op, positions, cache)


def check_position_values(op: str, positions: torch.Tensor, cache: torch.Tensor) -> None:
    """Positions lie in ``[0, cache rows)``; read only when `values_readable`."""
    n = positions.numel()
    if n and values_readable(positions):
        if n <= 64:  # a list beats a reduction for the few tokens of a decode step
            values = positions.reshape(-1).tolist()
            lo, hi = min(values), max(values)
        else:
            lo_t, hi_t = torch.aminmax(positions)
            lo, hi = int(lo_t), int(hi_t)
        max_pos = cache.shape[0]
        if lo < 0 or hi >= max_pos:
            bad = hi if hi >= max_pos else lo
            fail(op, "positions", f"holds position {bad}, outside the cos_sin_cache rows [0, {max_pos})")


def check_heads(op: str, arg: str, t: torch.Tensor, positions: torch.Tensor, head_size: int) -> None:
    """``t`` is ``[*positions.shape, hidden]`` or ``[*positions.shape, heads, head_size]``
    with ``hidden`` a multiple of ``head_size``."""
    lead = positions.dim()
    if tuple(t.shape[:lead]) != tuple(positions.shape) or not 1 <= t.dim() - lead <= 2:
        fail(
            op, arg,
            f"has shape {tuple(t.shape)}; expected [*positions.shape, hidden] or "
            f"[*positions.shape, heads, head_size] with positions.shape {tuple(positions.shape)}",
        )
    if t.dim() - lead == 2:
        if t.shape[-1] != head_size:
            fail(op, arg, f"last dim {t.shape[-1]} is not head_size {head_size}")
    elif t.shape[-1] % head_size:
        fail(op, arg, f"hidden size {t.shape[-1]} is not a multiple of head_size {head_size}")


def heads_ok(t: torch.Tensor, lead: torch.Size, head_size: int) -> bool:
    """Fast-path form of `check_heads` (no message)."""
    shape = t.shape
    n = len(lead)
    extra = len(shape) - n
    if shape[:n] != lead:
        return False
    if extra == 1:
        return shape[-1] % head_size == 0
    return extra == 2 and shape[-1] == head_size


def cache_ok(cache: torch.Tensor, head_size: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Fast-path form of `check_cache` (no message)."""
    cdt = cache.dtype
    if (cdt is not dtype and cdt is not torch.float32) or cache.ndim != 2 or cache.device != device:
        return False
    width = cache.shape[1]
    return 0 < width <= head_size and not width % 2
