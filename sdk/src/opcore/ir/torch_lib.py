"""Registration of `opcore.ir` ops in the ``opcore_ir`` torch library.

Each op gets its own ``torch.library.Library("opcore_ir", "FRAGMENT")`` so it can be
removed again (tests). The default overload's kernel is registered at
``CompositeExplicitAutograd`` (device-agnostic: CPU, CUDA, XLA, PrivateUse1 alike) and
dispatches among the providers exactly like an eager call; the fake implementation
validates the arguments and runs the native function on fake tensors. Ops declared with
``allow_inplace`` also get a ``maybe_inplace`` overload whose activations carry mutation
annotations and which returns one tensor per activation (an empty placeholder for an
activation passed as None).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.library import Library

if TYPE_CHECKING:
    from opcore.ir.op import IrOp

NAMESPACE = "opcore_ir"
INPLACE_OVERLOAD = "maybe_inplace"


def check_op_name_free(name: str) -> None:
    """Raise if ``opcore_ir::<name>`` exists already (defined outside this registry)."""
    if torch._C._dispatch_has_kernel(f"{NAMESPACE}::{name}") or _schema_exists(name):
        raise ValueError(f"torch op {NAMESPACE}::{name} is already defined")


def _schema_exists(name: str) -> bool:
    try:
        torch._C._get_schema(f"{NAMESPACE}::{name}", "")
    except RuntimeError:
        return False
    return True


def register(op: IrOp) -> None:
    lib = Library(NAMESPACE, "FRAGMENT")
    try:
        lib.define(op.name + op.schema)
        lib.impl(op.name, op._torch_impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{op.name}", op._fake_impl, lib=lib)
        if op.allow_inplace:
            qualified = f"{op.name}.{INPLACE_OVERLOAD}"
            lib.define(qualified + op.inplace_schema)
            lib.impl(qualified, op._torch_impl_inplace, "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{qualified}", op._fake_impl_inplace, lib=lib)
    except Exception:
        lib._destroy()
        raise
    op._lib = lib
    packet = getattr(getattr(torch.ops, NAMESPACE), op.name)
    op.torch_op = packet.default
    op.torch_op_inplace = getattr(packet, INPLACE_OVERLOAD) if op.allow_inplace else None


def unregister(op: IrOp) -> None:
    if op._lib is not None:
        op._lib._destroy()
        op._lib = None
    ns = getattr(torch.ops, NAMESPACE)
    # torch.ops caches the packet; drop it so a later op of the same name resolves anew.
    if op.name in ns.__dict__:
        delattr(ns, op.name)
    op.torch_op = None
    op.torch_op_inplace = None
