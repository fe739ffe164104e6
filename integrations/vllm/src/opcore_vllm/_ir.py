"""opcore providers as vLLM IR providers (``vllm.ir``).

For every op both registries define (computed here, at run time) and every opcore provider
of it, a vLLM provider ``opcore_<provider>`` is registered with vLLM's own
``IrOp.register_impl(provider, supported=..., supports_args=..., inplace=...)``:

- ``supported`` is the opcore provider's ``supported``;
- ``supports_args`` is opcore's validator followed by the provider's ``supports_args``: an
  argument opcore refuses (for example a weight whose dtype is not the activation's, which
  vLLM's ``rms_norm`` accepts) makes vLLM pass on to the next provider of its priority list
  instead of raising;
- ``inplace`` is the opcore provider's (only where vLLM's op allows in-place providers and
  both sides name the same activations): vLLM's ``maybe_inplace`` then calls opcore's
  ``maybe_inplace``, and both contracts say "the activations may be overwritten, use the
  returned tensors";
- the call goes through opcore's dispatch pinned to that provider (``IrOp.set_priority``),
  so opcore validates it and ``OPCORE_LOG_DISPATCH=1`` logs it.

Where the two sides differ, the adapter converts:

- epsilon types: a vLLM parameter annotated ``float`` may arrive as a NumPy or 0-d torch
  scalar when vLLM's torch wrapping is off (``vllm.ir.enable_torch_wrap(False)``); opcore's
  validator takes a Python ``float`` (or ``int``), so such values are passed as ``float(v)``;
- parameter lists: adapted only when names and defaults are the same on both sides (as in
  vLLM 0.33 for ``rms_norm`` and ``fused_add_rms_norm``); otherwise the op is refused with
  one line and vLLM's op keeps only its own providers.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable
from typing import Any

PREFIX = "opcore_"


def vllm_ops() -> dict[str, Any]:
    """vLLM's IR op registry (name -> ``vllm.ir.op.IrOp``), its built-in ops imported."""
    import vllm.ir  # noqa: F401  (importing it registers vLLM's ops)
    from vllm.ir.op import IrOp

    return dict(IrOp.registry)


def shared_op_names() -> list[str]:
    """The ops both vLLM's IR and opcore define, sorted."""
    import opcore.ir

    return sorted(set(vllm_ops()) & set(opcore.ir.all_ops()))


def _params(sig: inspect.Signature) -> list[tuple[str, Any]]:
    return [(p.name, p.default) for p in sig.parameters.values()]


def _describe(sig: inspect.Signature) -> str:
    return ", ".join(
        p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
        for p in sig.parameters.values()
    )


def mismatch(vop: Any, oop: Any) -> str | None:
    """Why ``oop`` (opcore) cannot serve ``vop`` (vLLM), or None when it can."""
    vsig = inspect.signature(vop.impls["native"].impl_fn)
    osig = inspect.signature(oop.native)
    if _params(vsig) != _params(osig):
        return (
            f"vLLM's parameters ({_describe(vsig)}) differ from opcore's ({_describe(osig)}); "
            "the adapter serves only the same names and defaults"
        )
    return None


def _float_positions(sig: inspect.Signature) -> tuple[int, ...]:
    return tuple(i for i, p in enumerate(sig.parameters.values()) if p.annotation is float)


def make_converter(sig: inspect.Signature) -> Callable[[tuple], tuple]:
    """``args -> args`` with each value of a ``float`` parameter that is a real number but
    not a Python float (NumPy, 0-d tensor) given as ``float(value)``."""
    positions = _float_positions(sig)

    def convert(args: tuple) -> tuple:
        out = None
        for i in positions:
            if i < len(args):
                v = args[i]
                if type(v) is not float and type(v) is not int and _is_number(v):
                    if out is None:
                        out = list(args)
                    out[i] = float(v)
        return args if out is None else tuple(out)

    return convert


def _is_number(v: Any) -> bool:
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return True
    import torch

    return isinstance(v, torch.Tensor) and v.ndim == 0 and v.is_floating_point()


def _bind(sig: inspect.Signature, args: tuple, kwargs: dict) -> tuple:
    if not kwargs:
        return args
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return tuple(bound.args)


def adapter(vop: Any, oop: Any, provider: str) -> tuple[Callable, Callable, bool]:
    """(impl_fn, supports_args, inplace) serving vLLM's ``vop`` with opcore's ``oop``
    pinned to ``provider``; both functions carry vLLM's native signature (vLLM checks it)."""
    impl = oop.impls[provider]
    vsig = inspect.signature(vop.impls["native"].impl_fn)
    convert = make_converter(vsig)
    inplace = bool(
        impl.inplace
        and getattr(vop, "allow_inplace", False)
        and tuple(vop.activations) == tuple(oop.activations)
    )
    provider_check = impl.supports_args
    priority = [provider]

    if inplace:

        def impl_fn(*args: Any, **kwargs: Any) -> Any:
            args = convert(_bind(vsig, args, kwargs))
            with oop.set_priority(priority):
                return oop.maybe_inplace(*args)

    else:

        def impl_fn(*args: Any, **kwargs: Any) -> Any:
            args = convert(_bind(vsig, args, kwargs))
            with oop.set_priority(priority):
                return oop(*args)

    def supports_args(*args: Any, **kwargs: Any) -> bool:
        args = convert(_bind(vsig, args, kwargs))
        try:
            oop.validate(*args)
        except Exception:
            return False
        return provider_check is None or bool(provider_check(*args))

    for fn in (impl_fn, supports_args):
        fn.__signature__ = vsig  # type: ignore[attr-defined]
        fn.__annotations__ = dict(vop.impls["native"].impl_fn.__annotations__)
    impl_fn.__qualname__ = impl_fn.__name__ = f"opcore_{provider}_{vop.name}"
    impl_fn.__module__ = __name__
    return impl_fn, supports_args, inplace


def _key_compile_caches(registered: Any, oop: Any, provider: str) -> None:
    """vLLM keys its compile caches by ``IrOpImpl.uuid()``, a hash of the file defining the
    implementation: for every adapter that is this file, whatever opcore kernel it reaches.
    The adapter's own registered impl therefore answers a hash of that file and of opcore's
    identity hash for the provider (its source, the sources it declares), so a changed
    opcore kernel changes vLLM's cache key too."""
    import hashlib
    from pathlib import Path

    own = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    identity = hashlib.sha256(f"{own}:{oop.identity_hash(provider)}".encode()).hexdigest()
    registered.uuid = lambda: identity


def register_ir(report: Any, vllm_registry: dict[str, Any] | None = None) -> None:
    """Register every opcore provider of every shared op with vLLM; refusals go to
    ``report.refuse``, registrations to ``report.providers``."""
    import opcore.ir

    opcore.ir.ensure_kernels_loaded()
    registry = vllm_ops() if vllm_registry is None else vllm_registry
    oops = opcore.ir.all_ops()
    for name in sorted(set(registry) & set(oops)):
        vop, oop = registry[name], oops[name]
        why = mismatch(vop, oop)
        if why is not None:
            report.refuse(f"ir.{name}", why)
            continue
        for provider, impl in sorted(oop.impls.items()):
            vname = PREFIX + provider
            if vname not in vop.impls:
                impl_fn, supports_args, inplace = adapter(vop, oop, provider)
                registered = vop.register_impl(
                    vname,
                    supported=bool(impl.supported),
                    supports_args=supports_args,
                    inplace=inplace,
                )(impl_fn)
                _key_compile_caches(registered, oop, provider)
            report.providers.setdefault(name, [])
            if vname not in report.providers[name]:
                report.providers[name].append(vname)
