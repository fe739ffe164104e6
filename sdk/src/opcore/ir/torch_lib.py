"""Registration of `opcore.ir` ops in the ``opcore_ir`` torch library.

Each op gets its own ``torch.library.Library("opcore_ir", "FRAGMENT")`` so it can be
removed again (tests). The default overload's kernel is registered at
``CompositeExplicitAutograd`` (device-agnostic: CPU, CUDA, XLA, PrivateUse1 alike) and
dispatches among the providers exactly like an eager call; the fake implementation
validates the arguments and runs the native function on fake tensors. Ops declared with
``allow_inplace`` also get a ``maybe_inplace`` overload whose activations carry mutation
annotations and which returns one tensor per activation (an empty placeholder for an
activation passed as None).

This module knows torch.library only: the op (`opcore.ir.op.IrOp`) hands it the schema
and the callables, and keeps the returned `TorchRegistration`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.library import Library

NAMESPACE = "opcore_ir"
INPLACE_OVERLOAD = "maybe_inplace"

# Names whose op had a maybe_inplace overload and was removed. TorchScript's operator
# registry keys an op by its name without the overload plus its argument and return types,
# which the two overloads share; removing both leaves one registry entry pointing at freed
# dispatcher state, and any later lookup of the name reads it. Such a name is refused until
# the process ends instead of crashing it.
_removed_with_inplace: set[str] = set()


@dataclasses.dataclass
class TorchRegistration:
    """What `register` made: the library fragment (destroyed by `unregister`) and the
    ``OpOverload`` objects (``inplace``: ``None`` without an in-place overload)."""

    name: str
    library: Any
    default: Any
    inplace: Any


def check_op_name_free(name: str) -> None:
    """Raise if ``opcore_ir::<name>`` exists already (defined outside this registry), or
    was defined with a ``maybe_inplace`` overload and removed in this process."""
    if name in _removed_with_inplace:
        raise ValueError(
            f"torch op {NAMESPACE}::{name} had a {INPLACE_OVERLOAD} overload and was removed "
            "in this process; torch's operator registry cannot take that name again until "
            "the process restarts (its overloads share one TorchScript registry key): "
            "use another name"
        )
    if torch._C._dispatch_has_kernel(f"{NAMESPACE}::{name}") or _schema_exists(name):
        raise ValueError(f"torch op {NAMESPACE}::{name} is already defined")


def _schema_exists(name: str) -> bool:
    try:
        torch._C._get_schema(f"{NAMESPACE}::{name}", "")
    except RuntimeError:
        return False
    return True


def register(
    name: str,
    schema: str,
    kernel: Callable[..., Any],
    fake: Callable[..., Any],
    *,
    inplace_schema: str | None = None,
    inplace_kernel: Callable[..., Any] | None = None,
    inplace_fake: Callable[..., Any] | None = None,
) -> TorchRegistration:
    """Define ``opcore_ir::<name>`` with ``schema`` (``"(Tensor x, ...) -> Tensor"``), its
    ``CompositeExplicitAutograd`` ``kernel`` and ``fake`` implementation; with
    ``inplace_schema`` also the ``maybe_inplace`` overload. Nothing is left defined when
    this raises."""
    lib = Library(NAMESPACE, "FRAGMENT")
    try:
        lib.define(name + schema)
        lib.impl(name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
        if inplace_schema is not None:
            qualified = f"{name}.{INPLACE_OVERLOAD}"
            lib.define(qualified + inplace_schema)
            lib.impl(qualified, inplace_kernel, "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{qualified}", inplace_fake, lib=lib)
    except Exception:
        lib._destroy()
        raise
    packet = getattr(getattr(torch.ops, NAMESPACE), name)
    return TorchRegistration(
        name=name,
        library=lib,
        default=packet.default,
        inplace=getattr(packet, INPLACE_OVERLOAD) if inplace_schema is not None else None,
    )


def unregister(registration: TorchRegistration) -> None:
    """Remove what `register` defined."""
    registration.library._destroy()
    if registration.inplace is not None:
        _removed_with_inplace.add(registration.name)
    ns = getattr(torch.ops, NAMESPACE)
    # torch.ops caches the packet; drop it so a later op of the same name resolves anew.
    if registration.name in ns.__dict__:
        delattr(ns, registration.name)
