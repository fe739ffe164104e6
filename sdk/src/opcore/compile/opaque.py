"""Opaque provider calls: ``torch.ops.opcore_impl.<op>.<provider>``.

Lowering traces a provider's function into the graph. A provider that cannot run on fake
tensors (a raw Triton launch needs real data pointers; a kernel may read tensor values)
goes into the graph as one call of an op registered here instead, so Inductor treats it
as an extern kernel and the same provider still runs. The lowering record says which.

For a functional provider the op has the IR op's schema. For an in-place provider
(``Impl.inplace``) the op mutates the activations and returns nothing: the activations
*are* the results. Lowering clones them first, exactly as the default overload does in
eager mode, and under Inductor wraps the call in ``auto_functionalized`` (Inductor's
graph is functional; see `opcore.compile.passes.lower`). An in-place provider that also
gives an out-of-place kernel (``register_impl(..., functional=)``) gets a second op,
``opcore_impl::<op>.<provider>_out_of_place``, with the IR op's schema, running that
kernel: lowering uses it wherever writing the activations is not allowed.

Ops are defined for every registered provider when a backend is called (`ensure_all`), not
on first use, so compiled code loaded from Inductor's cache in a fresh process finds them.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.library import Library

from opcore.ir import Impl, IrOp, all_ops
from opcore.ir.outputs import fresh_outputs

NAMESPACE = "opcore_impl"

_lock = threading.Lock()
_defined: dict[tuple[str, str], tuple[Impl, Library]] = {}


OUT_OF_PLACE_SUFFIX = "_out_of_place"


def _overload(provider: str) -> str:
    # "default" would collide with the default-overload naming torch uses for printing.
    return "p_default" if provider == "default" else provider


def has_out_of_place(impl: Impl) -> bool:
    """``impl`` is in place and brings its own out-of-place kernel (not the generic
    clone-then-write wrapper `register_impl` makes when none is given)."""
    return impl.inplace and getattr(impl.functional, "__wrapped__", None) is not impl.impl_fn


def _inplace_schema(op: IrOp) -> str:
    if op.inplace_schema is None:
        raise TypeError(f"op {op.name!r} was not registered with allow_inplace=True")
    params = op.inplace_schema.split(" -> ")[0]
    return params + " -> ()"


def define(op: IrOp, impl: Impl) -> None:
    """Define ``opcore_impl::<op>.<provider>`` for ``impl`` (idempotent; redefined when the
    provider was re-registered with a new function)."""
    key = (op.name, impl.provider)
    with _lock:
        known = _defined.get(key)
        if known is not None and known[0] is impl:
            return
        if known is not None:
            known[1]._destroy()
            del _defined[key]
        lib = Library(NAMESPACE, "FRAGMENT")
        qualified = f"{op.name}.{_overload(impl.provider)}"
        try:
            if impl.inplace:
                lib.define(qualified + _inplace_schema(op))
                lib.impl(qualified, _inplace_kernel(op, impl), "CompositeExplicitAutograd")
                torch.library.register_fake(f"{NAMESPACE}::{qualified}", _inplace_fake(op), lib=lib)
                if has_out_of_place(impl):
                    oop = qualified + OUT_OF_PLACE_SUFFIX
                    lib.define(oop + op.schema)
                    lib.impl(oop, _functional_kernel(op, impl), "CompositeExplicitAutograd")
                    torch.library.register_fake(f"{NAMESPACE}::{oop}", op.fake_impl, lib=lib)
            else:
                lib.define(qualified + op.schema)
                lib.impl(qualified, _functional_kernel(op, impl), "CompositeExplicitAutograd")
                torch.library.register_fake(f"{NAMESPACE}::{qualified}", op.fake_impl, lib=lib)
        except Exception:
            lib._destroy()
            raise
        _defined[key] = (impl, lib)
        packet = getattr(torch.ops, NAMESPACE).__dict__.get(op.name)
        if packet is not None:  # torch.ops caches overload packets; drop the stale one
            delattr(getattr(torch.ops, NAMESPACE), op.name)


def ensure_all() -> None:
    """Define the opaque op of every registered provider of every op."""
    for op in all_ops().values():
        for impl in list(op.impls.values()):
            define(op, impl)


def get(op: IrOp, impl: Impl, *, out_of_place: bool = False) -> Any:
    """The ``OpOverload`` for ``impl`` (defined on demand); ``out_of_place=True``: the op
    running the out-of-place kernel of an in-place provider (see `has_out_of_place`)."""
    define(op, impl)
    name = _overload(impl.provider)
    if out_of_place:
        if not has_out_of_place(impl):
            raise ValueError(
                f"op {op.name!r}: provider {impl.provider!r} has no out-of-place kernel"
            )
        name += OUT_OF_PLACE_SUFFIX
    return getattr(getattr(getattr(torch.ops, NAMESPACE), op.name), name)


def _functional_kernel(op: IrOp, impl: Impl):
    def kernel(*args: Any, **kwargs: Any) -> Any:
        # A custom op's outputs must not alias its inputs: copy any output that does.
        return fresh_outputs(impl.functional(*args, **kwargs), args, kwargs)

    return kernel


def _inplace_kernel(op: IrOp, impl: Impl):
    names = op.param_names

    def kernel(*args: Any, **kwargs: Any) -> None:
        outs = impl.impl_fn(*args, **kwargs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        # The contract: an in-place provider returns its activations. One that returns
        # other tensors still honours the op when its results land in the activations.
        for index, out in zip(op.activation_index, outs, strict=False):
            act = args[index] if index < len(args) else kwargs.get(names[index])
            if isinstance(act, torch.Tensor) and isinstance(out, torch.Tensor) and out is not act:
                act.copy_(out)

    return kernel


def _inplace_fake(op: IrOp):
    def fake(*args: Any, **kwargs: Any) -> None:
        op.validate(*args, **kwargs)

    return fake
