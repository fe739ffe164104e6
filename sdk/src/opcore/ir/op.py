"""`IrOp`: one op declared by its native function, its providers and its test metadata.

This module declares and registers: `register_op`, `IrOp.register_impl` and the op's
validator, fake, samples, tolerances and torch.library overloads. Calling and choosing a
provider (the per-call path) is `opcore.ir.dispatch`, which `IrOp` extends; one provider
is an `opcore.ir.impl.Impl`.

When torch is tracing (Dynamo, make_fx, torch.fx proxies, any active dispatch mode) a call
goes through ``torch.ops.opcore_ir.<name>`` instead, so the trace holds one opaque node.
"""

from __future__ import annotations

import inspect
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import torch

from opcore.ir import registry, torch_lib
from opcore.ir import schema as _schema
from opcore.ir.dispatch import (
    PRIORITY_SCOPE,
    Dispatcher,
    bump_generation,
    invalidate_caches,
    is_tracing,
    log_dispatch_enabled,
    priority_overrides,
    registry_generation,
)
from opcore.ir.impl import Impl, cloning_wrapper
from opcore.ir.outputs import fresh_outputs, map_outputs
from opcore.ir.samples import SampleGenerator, SampleInput, seeded_samples
from opcore.ir.tolerances import default_tolerance
from opcore.properties import as_properties

__all__ = [
    "PRIORITY_SCOPE",
    "RESERVED_PROVIDERS",
    "Impl",
    "IrOp",
    "all_ops",
    "bump_generation",
    "collective_ops",
    "get_op",
    "invalidate_caches",
    "is_tracing",
    "log_dispatch_enabled",
    "priority_overrides",
    "register_op",
    "registry_generation",
]

logger = logging.getLogger("opcore.ir")

NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
RESERVED_PROVIDERS = frozenset({"native"})

_REGISTRY = registry.OPS
_registry_lock = registry.lock


def _check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"{kind} name {name!r} is invalid: it must match {NAME_RE.pattern}")
    return name


class IrOp(Dispatcher):
    """An op declared by its native function. Use `register_op` to create one."""

    def __init__(
        self,
        name: str,
        native: Callable,
        *,
        activations: Sequence[str] | None = None,
        allow_inplace: bool = False,
        tolerances: Mapping[torch.dtype, tuple[float, float]] | None = None,
        error_budgets: Mapping[torch.dtype, tuple[float, float]] | None = None,
        collective: bool = False,
    ):
        self.name = name
        self.native = native
        # A collective op communicates across the ranks of a process group (its ``group``
        # argument names one): single-process checks and `all_ops()` leave it out, and
        # `collective_ops()` lists it (docs/distributed.md).
        self.collective = bool(collective)
        self.__doc__ = native.__doc__
        sig = _schema.signature(native)
        for p in sig.parameters.values():
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY):
                raise ValueError(
                    f"op {name!r}: parameter {p.name!r} is {p.kind.description}; native functions "
                    f"take plain positional-or-keyword parameters only"
                )
        self._signature = sig
        self.param_names = tuple(sig.parameters)
        if activations is None:
            activations = [p for p in self.param_names if p.startswith("x")]
        for a in activations:
            if a not in self.param_names:
                raise ValueError(
                    f"op {name!r}: activation {a!r} is not a parameter of {self.param_names}"
                )
        self.activations = tuple(activations)
        # positions of the activations among the parameters (for the compile passes too)
        self.activation_index = tuple(self.param_names.index(a) for a in self.activations)
        self.allow_inplace = allow_inplace
        self.schema = _schema.schema_of(native, name)
        self.inplace_schema = None
        if allow_inplace:
            if not self.activations:
                raise ValueError(
                    f"op {name!r}: allow_inplace needs at least one activation parameter"
                )
            arity = _schema.return_arity(native) or 1
            if arity != len(self.activations):
                raise ValueError(
                    f"op {name!r}: allow_inplace needs one returned tensor per activation "
                    f"({len(self.activations)} activations {self.activations}, {arity} outputs)"
                )
            self.inplace_schema = _schema.schema_of(native, name, mutates=self.activations)
        self.impls: dict[str, Impl] = {
            "native": Impl("native", native, True, None, False, op_name=name)
        }
        self._validator: Callable[..., None] | None = None
        self._fake: Callable[..., Any] | None = None
        self._sample_fn: SampleGenerator | None = None
        self._tolerances: dict[torch.dtype, tuple[float, float]] = dict(tolerances or {})
        self._error_budgets: dict[torch.dtype, tuple[float, float]] = dict(error_budgets or {})
        self._torch: torch_lib.TorchRegistration | None = None
        # The torch.library overloads, set by _register_torch_op (None only before it).
        self.torch_op: Any = None
        self.torch_op_inplace: Any = None
        self._init_dispatch(list(sig.parameters.values()))

    # ------------------------------------------------------------------ calling
    def _check_arity(self, args: tuple, kwargs: Mapping[str, Any] | None) -> None:
        """Raise a TypeError naming the op when the arguments do not fit its parameters
        (else return, and the caller re-raises the error it caught)."""
        try:
            self._signature.bind(*args, **(kwargs or {}))
        except TypeError as exc:
            params = ", ".join(
                p.name if p.default is p.empty else f"{p.name}={p.default!r}"
                for p in self._signature.parameters.values()
            )
            raise TypeError(f"opcore.ir.ops.{self.name}: {exc}; it takes ({params})") from None

    def maybe_inplace(self, *args: Any, **kwargs: Any) -> Any:
        """Like calling the op, but the caller donates the activations: an in-place
        provider may overwrite them, so their contents are undefined afterwards. Always use
        the returned tensors. Only for ops registered with ``allow_inplace=True``."""
        if not self.allow_inplace:
            raise TypeError(
                f"op {self.name!r} was not registered with allow_inplace=True; call it directly"
            )
        if is_tracing(args, kwargs):
            return self._from_inplace_list(self.torch_op_inplace(*args, **kwargs), args, kwargs)
        if not kwargs:
            return self._call_inplace(args)
        self.validate(*args, **kwargs)
        return self.dispatch(*args, **kwargs).impl_fn(*args, **kwargs)

    # ------------------------------------------------------------------ registration
    def register_impl(
        self,
        provider: str,
        supported: bool = True,
        supports_args: Callable[..., bool] | None = None,
        inplace: bool = False,
        functional: Callable | None = None,
        properties: Any = None,
        identity_sources: Iterable[Any] = (),
        bind: Callable[[Callable], Callable[..., tuple[Any, Callable | None]]] | None = None,
    ) -> Callable[[Callable], Callable]:
        """Decorator registering ``fn`` as ``provider``'s implementation; returns ``fn``.

        ``inplace=True``: ``fn`` writes its results into the activations (used by
        ``maybe_inplace``). The default overload must not mutate, so it calls
        ``functional`` (an out-of-place kernel with the same parameters) when given, and
        otherwise ``fn`` on clones of the activations.

        Args:
            provider: the provider's name (``^[a-z_][a-z0-9_]*$``, not a reserved one).
            supported: whether the provider can run in this process at all (e.g. its
                kernel library imported); an unsupported one is left out of every chain.
            supports_args: a predicate with the native function's parameters returning a
                plain bool: whether this provider takes these particular arguments.
            inplace: ``fn`` writes its results into the activations.
            functional: the out-of-place kernel used by the default overload of an
                ``inplace`` provider.
            properties: what the provider guarantees beyond numerics
                (docs/properties.md): a set of names from
                `opcore.properties.PROPERTY_NAMES` (``batch_invariant``,
                ``deterministic``, ``capture_safe``), a ``{name: bool}`` mapping or a
                `opcore.properties.Properties`; default none. The conformance suite
                checks each one declared, and a config that requires one
                (``kernel.required_properties``) selects only providers declaring it.
            identity_sources: modules (or functions) outside ``fn``'s own source file
                whose code also decides what the provider computes, such as shared launch
                helpers or its tuning launch space. Their source files enter the
                provider's identity hash (`identity_hash`). Compile caches and tuning
                tables are keyed on that hash, so editing such a file invalidates them.
            bind: ``bind(fn)`` returns a function with the op's parameters that computes
                ``fn`` (the default overload's callable, or ``fn`` itself for
                ``maybe_inplace``) for one call and returns ``(result, replay)``:
                ``replay`` (or ``None``) computes it for later calls whose signature is
                the same (device, dtype, shape, strides, 16-byte alignment of every
                tensor, the values of the other arguments), so it may skip what that
                signature decided (launch choices, a kernel's argument binding). See
                `opcore.ir.impl.Impl` and docs/design.md#per-call-path.

        Returns:
            The decorator; it returns ``fn`` unchanged.

        Raises:
            ValueError: a malformed or reserved name, a duplicate provider, parameters
                that differ from the native function's, a ``supports_args`` with other
                parameters, ``inplace=True`` on an op without ``allow_inplace``, or
                ``functional`` without ``inplace=True``, an unknown property name.
            TypeError: ``supported`` is not a bool, ``properties`` has another type.

        Examples:
            >>> import torch
            >>> from opcore.ir import ops
            >>> @ops.rms_norm.register_impl("doc_example")
            ... def rms_norm_doc(x, weight, epsilon, variance_size=None):
            ...     return ops.rms_norm.native(x, weight, epsilon, variance_size)
            >>> x, w = torch.ones(2, 8), torch.ones(8)
            >>> with ops.rms_norm.set_priority(["doc_example"]):
            ...     ops.rms_norm.dispatch(x, w, 1e-6).provider
            'doc_example'
            >>> ops.rms_norm.unregister_impl("doc_example")  # undo the example
        """
        _check_name("provider", provider)
        if provider in RESERVED_PROVIDERS:
            raise ValueError(f"op {self.name!r}: provider name {provider!r} is reserved")
        if not isinstance(supported, bool):
            raise TypeError(
                f"op {self.name!r}, provider {provider!r}: supported must be a bool, "
                f"got {supported!r}"
            )
        declared = as_properties(properties, where=f"op {self.name!r}, provider {provider!r}")
        sources = tuple(identity_sources)
        for src in sources:
            if not (inspect.ismodule(src) or callable(src)):
                raise TypeError(
                    f"op {self.name!r}, provider {provider!r}: identity_sources takes modules "
                    f"or functions, got {type(src).__name__}"
                )
        if supports_args is not None:
            _schema.check_same_parameters(
                self.native,
                supports_args,
                op_name=self.name,
                what=f"supports_args of provider {provider!r}",
            )
        if bind is not None and not callable(bind):
            raise TypeError(
                f"op {self.name!r}, provider {provider!r}: bind must be callable, got "
                f"{type(bind).__name__}"
            )
        if inplace and not self.allow_inplace:
            raise ValueError(
                f"op {self.name!r}: provider {provider!r} is inplace=True but the op was not "
                f"registered with allow_inplace=True"
            )
        if functional is not None:
            if not inplace:
                raise ValueError(
                    f"op {self.name!r}: provider {provider!r} gives functional= but is not "
                    f"inplace=True; register the out-of-place kernel itself instead"
                )
            _schema.check_same_parameters(
                self.native,
                functional,
                op_name=self.name,
                what=f"functional of provider {provider!r}",
            )

        def decorator(fn: Callable) -> Callable:
            _schema.check_same_parameters(
                self.native, fn, op_name=self.name, what=f"provider {provider!r}"
            )
            with _registry_lock:
                if provider in self.impls:
                    raise ValueError(
                        f"op {self.name!r}: provider {provider!r} is already registered"
                    )
                if functional is not None:
                    default_fn = functional
                elif inplace:
                    default_fn = cloning_wrapper(fn, self.activation_index, self.activations)
                else:
                    default_fn = fn
                self.impls[provider] = Impl(
                    provider,
                    fn,
                    supported,
                    supports_args,
                    inplace,
                    op_name=self.name,
                    functional=default_fn,
                    properties=declared,
                    identity_sources=sources,
                    bind=bind,
                )
                bump_generation()
            logger.debug(
                "op %s: provider %s registered (supported=%s, properties: %s)",
                self.name,
                provider,
                supported,
                declared,
            )
            return fn

        return decorator

    def declare_native_properties(self, properties: Any) -> None:
        """Declare the properties the ``native`` provider has in this process.

        The native function is plain PyTorch, so what it guarantees depends on the
        device's torch kernels (a reduction may change its order with the number of
        rows on one device and not on another): the current platform, which knows its
        device, declares it from its ``import_ir_kernels`` after measuring it with the
        conformance suite. ``properties`` takes the forms `register_impl` accepts; it
        replaces what was declared before (by default nothing).

        Raises:
            ValueError: an unknown property name.
            TypeError: ``properties`` has another type.
        """
        declared = as_properties(properties, where=f"op {self.name!r}, provider 'native'")
        with _registry_lock:
            self.impls["native"].properties = declared
            bump_generation()

    def unregister_impl(self, provider: str) -> None:
        """Remove a provider (tests and plugin unloading). ``native`` cannot be removed."""
        if provider == "native":
            raise ValueError(f"op {self.name!r}: the native provider cannot be removed")
        with _registry_lock:
            if self.impls.pop(provider, None) is None:
                raise KeyError(f"op {self.name!r} has no provider {provider!r}")
            bump_generation()

    def register_validator(self, fn: Callable[..., None]) -> Callable[..., None]:
        """Decorator: ``fn`` (same parameters as the native function) checks argument
        metadata and raises ``ValueError`` naming op and argument. It runs once per call
        before dispatch, for every provider, and in the fake implementation."""
        _schema.check_same_parameters(self.native, fn, op_name=self.name, what="validator")
        self._validator = fn
        return fn

    @property
    def validator(self) -> Callable[..., None] | None:
        """The function `register_validator` registered (``None``: none)."""
        return self._validator

    def register_fake(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: ``fn`` (same parameters as the native function) returns empty
        outputs of the right shape, dtype and device; used when torch traces with fake
        tensors (default: the native function, which is slower to trace)."""
        _schema.check_same_parameters(
            self.native, fn, op_name=self.name, what="fake implementation"
        )
        self._fake = fn
        return fn

    def register_sample_inputs(self, fn: SampleGenerator) -> SampleGenerator:
        """Decorator: ``fn(dtype, *, quick, generator)`` yields `SampleInput` on the CPU."""
        self._sample_fn = fn
        return fn

    def validate(self, *args: Any, **kwargs: Any) -> None:
        """Run the op's validator (no-op when it has none). Arguments that do not fit the
        op's parameters raise a ``TypeError`` naming the op."""
        if self._validator is not None:
            try:
                self._validator(*args, **kwargs)
            except TypeError:
                self._check_arity(args, kwargs)
                raise
        else:
            self._check_arity(args, kwargs)

    # ------------------------------------------------------------------ test metadata
    def sample_inputs(
        self,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        *,
        quick: bool = True,
    ) -> Iterator[SampleInput]:
        """Named samples for this op: generated on the CPU, each from a seed made from its
        name (`opcore.ir.samples.seeded_samples`), then moved to ``device`` keeping layouts
        (strided rows stay strided views of one buffer)."""
        if self._sample_fn is None:
            raise RuntimeError(f"op {self.name!r} has no sample input generator")
        device = torch.device(device)
        for sample in seeded_samples(self.name, self._sample_fn, dtype, quick=quick):
            yield sample.to(device)

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        """``(atol, rtol)`` for comparing this op's outputs in ``dtype``."""
        if dtype in self._tolerances:
            return self._tolerances[dtype]
        return default_tolerance(dtype)

    def override_tolerance(self, dtype: torch.dtype, *, atol: float, rtol: float) -> None:
        self._tolerances[dtype] = (float(atol), float(rtol))

    def error_budget(self, dtype: torch.dtype) -> tuple[float, float] | None:
        """``(factor, floor_ulps)`` declared for this op's outputs in ``dtype``: how much
        less accurate than ``native`` a provider may be, in the conformance suite's error
        budget (peak ULP error <= max(factor x native's, floor_ulps)); None: the suite's."""
        return self._error_budgets.get(dtype)

    def identity_hash(self, provider: str) -> str:
        """SHA-256 of the provider's source file (plus op and provider names)."""
        try:
            return self.impls[provider].identity_hash()
        except KeyError:
            raise KeyError(
                f"op {self.name!r} has no provider {provider!r}; "
                f"registered: {', '.join(self.impls)}"
            ) from None

    def supported_providers(self) -> list[str]:
        return [p for p, impl in self.impls.items() if impl.supported]

    # ------------------------------------------------------------------ torch side
    def _torch_impl(self, *args: Any, **kwargs: Any) -> Any:
        # The CompositeExplicitAutograd kernel of the default overload: same dispatch as
        # eager, outputs made fresh and contiguous to match the fake implementation.
        self.validate(*args, **kwargs)
        out = self.dispatch(*args, **kwargs).functional(*args, **kwargs)
        return fresh_outputs(out, args, kwargs)

    def _torch_impl_inplace(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        # The maybe_inplace overload behaves functionally here (its schema allows, but
        # does not require, mutating the activations). A compile pass can rewrite it to
        # the default overload once it has checked the activations are dead.
        return self._to_inplace_tuple(self._torch_impl(*args, **kwargs))

    def fake_impl(self, *args: Any, **kwargs: Any) -> Any:
        """The op's fake implementation as torch registers it: validates the arguments,
        then returns the registered fake's (or the native function's) outputs, made
        contiguous. For custom ops that mirror this op (the compile passes)."""
        self.validate(*args, **kwargs)
        out = (self._fake or self.native)(*args, **kwargs)
        return map_outputs(out, lambda t: t.contiguous())

    def fake_impl_inplace(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        """`fake_impl` in the ``maybe_inplace`` overload's form (one tensor per
        activation)."""
        return self._to_inplace_tuple(self.fake_impl(*args, **kwargs))

    def _register_torch_op(self) -> None:
        """Define ``opcore_ir::<name>`` (and ``.maybe_inplace``) for this op."""
        reg = torch_lib.register(
            self.name,
            self.schema,
            self._torch_impl,
            self.fake_impl,
            inplace_schema=self.inplace_schema,
            inplace_kernel=self._torch_impl_inplace,
            inplace_fake=self.fake_impl_inplace,
        )
        self._torch = reg
        self.torch_op = reg.default
        self.torch_op_inplace = reg.inplace

    def _unregister_torch_op(self) -> None:
        if self._torch is not None:
            torch_lib.unregister(self._torch)
            self._torch = None
        self.torch_op = None
        self.torch_op_inplace = None

    def _to_inplace_tuple(self, out: Any) -> tuple[torch.Tensor, ...]:
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        ref = next(o for o in outs if o is not None)
        return tuple(ref.new_empty(0) if o is None else o for o in outs)

    def _from_inplace_list(self, outs: Any, args: tuple, kwargs: Mapping[str, Any]) -> Any:
        """Rebuild the native return value from the ``maybe_inplace`` overload's tuple
        (one tensor per activation; a placeholder where the activation is ``None``)."""
        if isinstance(outs, torch.Tensor):
            outs = (outs,)
        result = []
        for out, i, name in zip(outs, self.activation_index, self.activations, strict=True):
            value = args[i] if i < len(args) else kwargs.get(name)
            result.append(None if value is None else out)
        return (
            result[0]
            if len(result) == 1 and _schema.return_arity(self.native) is None
            else tuple(result)
        )

    def __repr__(self) -> str:
        return f"<opcore.ir op {self.name}{self.schema} providers={list(self.impls)}>"


@overload
def register_op(f: Callable, /) -> IrOp: ...


@overload
def register_op(
    f: None = None,
    *,
    name: str | None = None,
    activations: Sequence[str] | None = None,
    allow_inplace: bool = False,
    tolerances: Mapping[torch.dtype, tuple[float, float]] | None = None,
    error_budgets: Mapping[torch.dtype, tuple[float, float]] | None = None,
    collective: bool = False,
) -> Callable[[Callable], IrOp]: ...


def register_op(
    f: Callable | None = None,
    *,
    name: str | None = None,
    activations: Sequence[str] | None = None,
    allow_inplace: bool = False,
    tolerances: Mapping[torch.dtype, tuple[float, float]] | None = None,
    error_budgets: Mapping[torch.dtype, tuple[float, float]] | None = None,
    collective: bool = False,
) -> Any:
    """Declare an op by its native function; returns the `IrOp`.

    Usable bare (``@register_op``) or with options. ``name`` defaults to the function's
    name and must match ``^[a-z_][a-z0-9_]*$``. ``activations`` default to the parameters
    whose name starts with ``x``; ``allow_inplace`` adds `IrOp.maybe_inplace` and the
    ``opcore_ir::<name>.maybe_inplace`` overload (activations marked mutable).
    ``tolerances`` override the default ``(atol, rtol)`` per dtype; ``error_budgets`` set
    the conformance suite's ``(factor, floor_ulps)`` per dtype (`IrOp.error_budget`).

    Args:
        f: the native function, when used bare; its body is the op's semantics.
        name: the op's name (default: the function's name).
        activations: names of the parameters that are activations.
        allow_inplace: add the ``maybe_inplace`` entry point and overload.
        tolerances: ``{dtype: (atol, rtol)}`` overriding the defaults.
        error_budgets: ``{dtype: (factor, floor_ulps)}`` for the conformance suite.
        collective: the op communicates across the ranks of a process group named by
            its ``group`` argument; it is listed by `collective_ops`, not `all_ops`.

    Returns:
        The `IrOp` when used bare, else a decorator returning it. The op is also
            ``opcore.ir.ops.<name>`` and ``torch.ops.opcore_ir.<name>``.

    Raises:
        ValueError: the name is malformed, already registered, or taken by a member of
            `opcore.ir.ops` or an existing ``opcore_ir`` torch op.

    Examples:
        >>> import torch
        >>> from opcore.ir import register_op
        >>> from opcore.testing.ir import unregister_op
        >>> @register_op
        ... def doc_scale(x: torch.Tensor, factor: float) -> torch.Tensor:
        ...     return x * factor
        >>> doc_scale(torch.ones(2), 3.0)
        tensor([3., 3.])
        >>> unregister_op("doc_scale")  # undo the example
    """

    def decorator(fn: Callable) -> IrOp:
        op_name = _check_name("op", name if name is not None else fn.__name__)
        with _registry_lock:
            if op_name in _REGISTRY:
                raise ValueError(f"op {op_name!r} is already registered")
            torch_lib.check_op_name_free(op_name)
            _check_namespace_free(op_name)
            op = IrOp(
                op_name,
                fn,
                activations=activations,
                allow_inplace=allow_inplace,
                tolerances=tolerances,
                error_budgets=error_budgets,
                collective=collective,
            )
            op._register_torch_op()
            _REGISTRY[op_name] = op
            bump_generation()
        return op

    if f is not None:
        return decorator(f)
    return decorator


def _forget(op: IrOp) -> None:
    """`opcore.ir.registry.unregister_op` removed ``op`` from the table."""
    op._unregister_torch_op()
    bump_generation()


registry.on_unregister(_forget)


def _check_namespace_free(name: str) -> None:
    """An op may not take the name of a member of the `opcore.ir.ops` module (it would be
    hidden there). Read only: the module lists its ops itself."""
    namespace = sys.modules.get("opcore.ir.ops")
    if namespace is not None and name in namespace.__dict__:
        raise ValueError(f"op name {name!r} is taken by opcore.ir.ops.{name} (a module member)")


def get_op(name: str) -> IrOp:
    """The registered op ``name``; ``AttributeError`` listing the registered ops when
    there is none (so ``ops.<typo>`` reads naturally)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise AttributeError(
            f"opcore.ir has no op {name!r}; registered ops: {', '.join(sorted(_REGISTRY))}"
        ) from None


def all_ops() -> dict[str, IrOp]:
    """Every registered single-process op, by name (a copy): the ops one process can
    compute and check alone. Collective ops are in `collective_ops`."""
    return {name: op for name, op in sorted(_REGISTRY.items()) if not op.collective}


def collective_ops() -> dict[str, IrOp]:
    """Every registered collective op, by name (a copy): ops that communicate across the
    ranks of a process group, checked by ``opcore conformance --world-size N``."""
    return {name: op for name, op in sorted(_REGISTRY.items()) if op.collective}
