"""Call signatures: what the per-call path (`opcore.ir.dispatch`) keys a call by.

A signature holds everything the validator, ``supports_args``, the tuning router and a
provider's launcher read from a call (their contract: metadata only), so two calls with
one signature are served by one decision (docs/design.md#per-call-path).
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch


def _tensor_terms(name: str) -> str:
    return (
        f"{name}.dtype, {name}.shape, {name}.stride(), {name}.data_ptr() & 15, {name}.get_device()"
    )


def parameter_kinds(parameters: Sequence[inspect.Parameter]) -> tuple[str, ...]:
    """Per parameter, what its annotation promises: ``"tensor"`` (``torch.Tensor``),
    ``"optional"`` (``torch.Tensor | None``), ``"value"`` (``float``, ``int``, ``bool``,
    ``str``) or ``"any"``."""
    kinds = []
    for p in parameters:
        ann = p.annotation
        if ann is torch.Tensor:
            kinds.append("tensor")
        elif typing.get_origin(ann) in (typing.Union, types.UnionType) and set(
            typing.get_args(ann)
        ) == {torch.Tensor, type(None)}:
            kinds.append("optional")
        elif ann in (float, int, bool, str):
            kinds.append("value")
        else:
            kinds.append("any")
    return tuple(kinds)


@functools.lru_cache(maxsize=64)
def signature_function(kinds: tuple[str, ...], min_args: int) -> Callable[[tuple], tuple]:
    """``signature(args) -> tuple`` for calls of ``min_args`` to ``len(kinds)`` positional
    arguments: per tensor its dtype, shape, strides, data pointer modulo 16 and device
    index (what a kernel binary and its launch choices depend on); per other argument its
    type and value (``True`` and ``1`` differ). It raises (``ValueError`` for another
    arity, ``AttributeError`` / ``TypeError`` / ``RuntimeError`` for arguments without
    these) where a call has no signature: such calls take the full path, whose validator
    names what is wrong.

    The function is generated for the parameters' kinds (`parameter_kinds`) so that a call
    pays attribute reads only, no loop: this runs on every eager call."""

    def term(kind: str, a: str) -> str:
        tensor = f"({_tensor_terms(a)})"
        if kind == "tensor":
            return tensor
        if kind == "optional":
            return f"None if {a} is None else {tensor}"
        if kind == "value":
            return f"({a}.__class__, {a})"
        return f"{tensor} if isinstance({a}, _Tensor) else ({a}.__class__, {a})"

    lines = ["def signature(args):", "    n = len(args)"]
    for n in range(min_args, len(kinds) + 1):
        names = [f"a{i}" for i in range(n)]
        lines.append(f"    if n == {n}:")
        if not names:
            lines.append("        return ()")
            continue
        lines.append(f"        {', '.join(names)}, = args")
        terms = ", ".join(term(k, a) for k, a in zip(kinds, names, strict=False))
        lines.append(f"        return ({terms},)")
    lines.append("    raise ValueError('no signature for this arity')")
    source = "\n".join(lines)
    namespace: dict[str, Any] = {"_Tensor": torch.Tensor}
    exec(compile(source, f"<opcore signature {kinds}>", "exec"), namespace)
    fn = namespace["signature"]
    fn.__source__ = source
    return fn
