"""Opaque provider calls: ``torch.ops.opcore_impl.<op>__<provider>``.

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
``opcore_impl::<op>__<provider>__out_of_place``, with the IR op's schema, running that
kernel: lowering uses it wherever writing the activations is not allowed.

Each of these is its own op with only a default overload, never one overload per provider
of a shared ``opcore_impl::<op>``. TorchScript's operator registry keys an op by its name
without the overload plus its argument and return types, so providers of one op sharing a
schema would share one key. Destroying one of them (a re-registered provider, or every
library at interpreter exit) then leaves the others' registry entries pointing at freed
dispatcher entries, and the next removal or lookup of that name aborts the process.

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


OUT_OF_PLACE_SUFFIX = "__out_of_place"


def op_name(op: IrOp, impl: Impl, *, out_of_place: bool = False) -> str:
    """The name of ``impl``'s opaque op in ``opcore_impl`` (``<op>__<provider>``, with
    ``__out_of_place`` for an in-place provider's out-of-place kernel)."""
    name = f"{op.name}__{impl.provider}"
    return name + OUT_OF_PLACE_SUFFIX if out_of_place else name


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
    """Define ``opcore_impl::<op>__<provider>`` for ``impl`` (idempotent; redefined when
    the provider was re-registered with a new function)."""
    key = (op.name, impl.provider)
    with _lock:
        known = _defined.get(key)
        if known is not None and known[0] is impl:
            return
        if known is not None:
            known[1]._destroy()
            del _defined[key]
        lib = Library(NAMESPACE, "FRAGMENT")
        name = op_name(op, impl)
        names = [name]
        try:
            if impl.inplace:
                lib.define(name + _inplace_schema(op))
                lib.impl(name, _inplace_kernel(op, impl), "CompositeExplicitAutograd")
                torch.library.register_fake(f"{NAMESPACE}::{name}", _inplace_fake(op), lib=lib)
                if has_out_of_place(impl):
                    oop = op_name(op, impl, out_of_place=True)
                    names.append(oop)
                    lib.define(oop + op.schema)
                    lib.impl(oop, _functional_kernel(op, impl), "CompositeExplicitAutograd")
                    torch.library.register_fake(f"{NAMESPACE}::{oop}", op.fake_impl, lib=lib)
            else:
                lib.define(name + op.schema)
                lib.impl(name, _functional_kernel(op, impl), "CompositeExplicitAutograd")
                torch.library.register_fake(f"{NAMESPACE}::{name}", op.fake_impl, lib=lib)
        except Exception:
            lib._destroy()
            raise
        _defined[key] = (impl, lib)
        namespace = getattr(torch.ops, NAMESPACE)
        for defined in names:  # torch.ops caches overload packets; drop any stale one
            if defined in namespace.__dict__:
                delattr(namespace, defined)


def ensure_all() -> None:
    """Define the opaque op of every registered provider of every op."""
    for op in all_ops().values():
        for impl in list(op.impls.values()):
            define(op, impl)


def get(op: IrOp, impl: Impl, *, out_of_place: bool = False) -> Any:
    """The ``OpOverload`` for ``impl`` (defined on demand); ``out_of_place=True``: the op
    running the out-of-place kernel of an in-place provider (see `has_out_of_place`)."""
    if out_of_place and not has_out_of_place(impl):
        raise ValueError(f"op {op.name!r}: provider {impl.provider!r} has no out-of-place kernel")
    define(op, impl)
    name = op_name(op, impl, out_of_place=out_of_place)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


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
