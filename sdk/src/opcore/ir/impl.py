"""`Impl`: one provider of one op, as `IrOp.register_impl` recorded it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opcore.ir.identity import hash_source, hash_source_pair, hash_sources
from opcore.properties import Properties

# bind(fn) -> binder; binder(*args) -> (result, replay or None): see `Impl`.
Binder = Callable[[Callable[..., Any]], Callable[..., tuple[Any, Callable[..., Any] | None]]]


class Impl:
    """One provider of one op.

    ``impl_fn`` has the native function's parameters. ``supported`` is static (library or
    hardware present). ``supports_args`` (or ``None`` for "every argument") decides per call
    from metadata alone and returns a plain bool. ``inplace`` providers write their outputs
    into the op's activations; ``functional`` is the callable the default overload uses
    (``impl_fn``, or for an in-place provider a wrapper that clones the activations first).

    ``bind`` (optional) prepares the later calls of one signature: ``bind(fn)`` (``fn`` is
    ``functional`` for the default overload, ``impl_fn`` for ``maybe_inplace``) returns a
    function that computes ``fn(*args)`` once and returns ``(result, replay)``, where
    ``replay`` (or ``None``: keep calling ``fn``) takes the same arguments and may assume
    every one has the metadata the first call's had (device, dtype, shape, strides,
    16-byte alignment, the values of the non-tensor arguments). Dispatch keeps ``replay``
    per signature (docs/design.md#per-call-path).
    """

    __slots__ = (
        "identity_sources",
        "provider",
        "impl_fn",
        "supported",
        "supports_args",
        "inplace",
        "op_name",
        "functional",
        "properties",
        "bind",
        "_identity",
    )

    def __init__(
        self,
        provider: str,
        impl_fn: Callable,
        supported: bool,
        supports_args: Callable[..., bool] | None,
        inplace: bool,
        *,
        op_name: str = "",
        functional: Callable | None = None,
        properties: Properties | None = None,
        identity_sources: tuple = (),
        bind: Binder | None = None,
    ):
        self.identity_sources = identity_sources
        self.provider = provider
        self.impl_fn = impl_fn
        self.supported = supported
        self.supports_args = supports_args
        self.inplace = inplace
        self.op_name = op_name
        self.functional = functional if functional is not None else impl_fn
        self.properties = properties if properties is not None else Properties()
        self.bind = bind
        self._identity: str | None = None

    @property
    def supports_all_args(self) -> bool:
        return self.supports_args is None

    def identity_hash(self) -> str:
        if self._identity is None:
            identity = hash_source(self.impl_fn, op_name=self.op_name, provider=self.provider)
            if self.inplace and getattr(self.functional, "__wrapped__", None) is not self.impl_fn:
                # A separate out-of-place kernel serves the default overload: it is part
                # of what this provider computes, so it is part of its identity.
                extra = hash_source(self.functional, op_name=self.op_name, provider=self.provider)
                identity = hash_source_pair(identity, extra)
            if self.identity_sources:
                # Code outside the provider's own file that decides what it computes
                # (shared launch helpers, its launch space): part of its identity too.
                identity = hash_source_pair(identity, hash_sources(self.identity_sources))
            self._identity = identity
        return self._identity

    def __repr__(self) -> str:
        fn_name = getattr(self.impl_fn, "__qualname__", self.impl_fn)
        args_check = "None" if self.supports_args is None else "fn"
        return (
            f"Impl(provider={self.provider!r}, impl_fn={fn_name!r}, "
            f"supported={self.supported}, supports_args={args_check}, "
            f"inplace={self.inplace}, properties={str(self.properties)!r})"
        )


def cloning_wrapper(fn: Callable, indices: tuple[int, ...], names: tuple[str, ...]) -> Callable:
    """Call in-place ``fn`` on clones of the activations, so the caller's tensors are
    untouched (the default overload's contract)."""

    def functional(*given: Any, **kwargs: Any) -> Any:
        args = list(given)
        for i, name in zip(indices, names, strict=True):
            if i < len(args):
                if args[i] is not None:
                    args[i] = args[i].clone()
            elif kwargs.get(name) is not None:
                kwargs[name] = kwargs[name].clone()
        return fn(*args, **kwargs)

    functional.__wrapped__ = fn  # type: ignore[attr-defined]
    functional.__qualname__ = getattr(fn, "__qualname__", "fn") + ".<functional>"
    return functional
