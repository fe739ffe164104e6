"""Torch schema strings and signature checks derived from an op's native function.

The native function's annotations define the op's torch schema (``Tensor``, ``Tensor?``,
``int`` as ``SymInt``, ``float``, ``bool``, ``str``; returns ``Tensor`` or a tuple of
``Tensor`` / ``Tensor?``). Providers, ``supports_args`` and validators must have the same
parameter names, kinds and defaults, so the dispatcher can pass ``*args, **kwargs`` to
each of them unchanged.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Sequence

import torch

_SCALARS = {int: "SymInt", float: "float", bool: "bool", str: "str"}


def signature(fn: Callable) -> inspect.Signature:
    try:
        return inspect.signature(fn, eval_str=True)
    except (NameError, TypeError):
        return inspect.signature(fn)


def _strip_optional(tp: object) -> tuple[object, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _type_str(tp: object, where: str) -> str:
    inner, optional = _strip_optional(tp)
    if inner is torch.Tensor:
        base = "Tensor"
    elif inner in _SCALARS:
        base = _SCALARS[inner]
    else:
        raise TypeError(
            f"{where}: unsupported annotation {tp!r}; use Tensor, int, float, bool, str, "
            "or X | None"
        )
    return base + ("?" if optional else "")


def _default_str(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return '"' + value + '"'
    return repr(value)


def schema_of(fn: Callable, op_name: str, mutates: Sequence[str] = ()) -> str:
    """The torch schema (without the name) of native function ``fn``, e.g.
    ``(Tensor x, Tensor? weight, float epsilon, SymInt? variance_size=None) -> Tensor``.

    Parameters named in ``mutates`` get a mutation annotation ``Tensor(aN!)``, and the
    return becomes one plain ``Tensor`` per activation, in order; an optional activation
    passed as ``None`` gets an empty placeholder tensor (functionalization supports
    neither optional nor list returns on mutable custom ops)."""
    sig = signature(fn)
    parts = []
    for i, p in enumerate(sig.parameters.values()):
        where = f"op {op_name!r}, parameter {p.name!r}"
        if p.annotation is inspect.Parameter.empty:
            raise TypeError(f"{where}: the native function must annotate every parameter")
        t = _type_str(p.annotation, where)
        if p.name in mutates:
            if t not in ("Tensor", "Tensor?"):
                raise TypeError(f"{where}: only a Tensor parameter can be an activation")
            t = f"Tensor(a{i}!)" + ("?" if t.endswith("?") else "")
        text = f"{t} {p.name}"
        if p.default is not inspect.Parameter.empty:
            text += "=" + _default_str(p.default)
        parts.append(text)
    if mutates:
        return "(" + ", ".join(parts) + ") -> (" + ", ".join("Tensor" for _ in mutates) + ")"
    ret = sig.return_annotation
    where = f"op {op_name!r}, return annotation"
    if ret is inspect.Signature.empty:
        raise TypeError(f"{where}: the native function must annotate its return type")
    if typing.get_origin(ret) is tuple:
        items = typing.get_args(ret)
        rets = [_type_str(a, where) for a in items]
        if any(r not in ("Tensor", "Tensor?") for r in rets):
            raise TypeError(f"{where}: a tuple return may hold only Tensor or Tensor | None")
        ret_text = "(" + ", ".join(rets) + ")"
    else:
        ret_text = _type_str(ret, where)
        if ret_text != "Tensor":
            raise TypeError(f"{where}: return Tensor or a tuple of tensors")
    return "(" + ", ".join(parts) + ") -> " + ret_text


def return_arity(fn: Callable) -> int | None:
    """Number of returned values for a tuple return, ``None`` for a single Tensor."""
    ret = signature(fn).return_annotation
    if typing.get_origin(ret) is tuple:
        return len(typing.get_args(ret))
    return None


def parameters_key(fn: Callable) -> list[tuple[str, object, object]]:
    """What must match between the native function and a provider: names, kinds, defaults."""
    return [(p.name, p.kind, p.default) for p in signature(fn).parameters.values()]


def format_parameters(fn: Callable) -> str:
    out = []
    for p in signature(fn).parameters.values():
        out.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
    return "(" + ", ".join(out) + ")"


def check_same_parameters(native: Callable, other: Callable, *, op_name: str, what: str) -> None:
    """Raise ``ValueError`` unless ``other`` has exactly ``native``'s parameters."""
    if not callable(other):
        raise ValueError(f"op {op_name!r}: {what} must be callable, got {other!r}")
    try:
        other_key = parameters_key(other)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"op {op_name!r}: {what} has no inspectable signature: {exc}") from None
    if other_key != parameters_key(native):
        raise ValueError(
            f"op {op_name!r}: {what} has parameters {format_parameters(other)}, but the native "
            f"function has {format_parameters(native)}; names, order, kinds and defaults must "
            "be identical"
        )
