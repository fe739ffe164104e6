"""`IrOp`: one op, its native function, its providers, and dispatch among them.

Hot path (`IrOp.__call__` in eager mode): validate the arguments (metadata checks shared by
every provider), take the cached effective priority chain, return the first provider whose
``supports_args`` accepts the arguments, call it.

What decides the chain is the current config and the op's `set_priority` list, both scoped
to the thread or asyncio task (`opcore.scopes`), plus the provider registry. The cache is
one tuple per op, checked by two compares: the identity of this context's scope stack
(`opcore.scopes.current_scopes()`, which changes when any block is entered or left) and the
registry generation (bumped when a provider or op is registered or removed, kernels load,
or `invalidate_caches()` is called). On a miss the decision is looked up by value (config
object, this op's override), so threads or blocks that alternate between a few settings
decide each one once.

When torch is tracing (Dynamo, make_fx, torch.fx proxies, any active dispatch mode) the
call goes through ``torch.ops.opcore_ir.<name>`` instead, so the trace holds one opaque node.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import torch

from opcore import config as _config
from opcore.env import env_flag
from opcore.ir import priority, torch_lib
from opcore.ir import schema as _schema
from opcore.ir.identity import hash_source, hash_source_pair, hash_sources
from opcore.ir.outputs import fresh_outputs, map_outputs
from opcore.ir.samples import SampleGenerator, SampleInput, seeded_samples
from opcore.ir.tolerances import default_tolerance
from opcore.platforms.kernels import ensure_kernels_loaded, on_kernels_loaded
from opcore.properties import Properties, as_properties
from opcore.scopes import ScopeKind, current_scopes
from opcore.tuning import runtime as tuning_runtime

logger = logging.getLogger("opcore.ir")
dispatch_logger = logging.getLogger("opcore.ir.dispatch")

NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
RESERVED_PROVIDERS = frozenset({"native"})

_REGISTRY: dict[str, IrOp] = {}
_registry_lock = threading.RLock()
# Bumped on every change that can alter a dispatch decision other than the config and the
# set_priority scopes (those are per thread / task and keyed by identity instead).
_GENERATION = 0
# The open set_priority blocks of this thread / asyncio task; a frame's value is
# (op name, providers tuple).
PRIORITY_SCOPE = "ir_priority"  # the `opcore.scopes.Frame.kind` of set_priority blocks
_PRIORITY_SCOPES = ScopeKind(PRIORITY_SCOPE)
_CONFIG_SCOPE = _config.CONFIG_SCOPE
_NO_CACHE = (None, -1, None, None, False, None, None)

# Bound once: these run on every eager call. Dynamo folds is_dynamo_compiling() to True
# while tracing; export and AOT tracing run under a dispatch mode (second check).
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_has_torch_function = torch._C._has_torch_function


def bump_generation() -> None:
    """Invalidate every op's dispatch cache (and compiled graphs' cache keys)."""
    global _GENERATION
    _GENERATION += 1


# Decisions made while the kernels were loading saw a partial registry.
on_kernels_loaded(bump_generation)


# registry_generation(): a counter bumped whenever registered ops or providers change
# (kernels loaded, `invalidate_caches()` included): what a dispatch decision depends on
# besides the config and the `set_priority` scopes. A C-level callable (no Python frame):
# compiled graphs call it on every call, where Dynamo's frame hook makes each Python frame
# cost about a microsecond.
registry_generation = functools.partial(getattr, sys.modules[__name__], "_GENERATION")


def priority_overrides(frames: tuple | None = None) -> dict[str, tuple[str, ...]]:
    """``{op name: providers}`` of the `set_priority` blocks open in this thread or task
    (``frames``: an `opcore.scopes.current_scopes()` value; default: the current one). The
    innermost block of an op wins."""
    return dict(_PRIORITY_SCOPES.values(frames))


def invalidate_caches() -> None:
    """Drop every op's cached priority chain (call after mutating the current config's
    ``kernel.ir_op_priority`` in place)."""
    bump_generation()


def is_tracing(args: tuple, kwargs: Mapping[str, Any] | None = None) -> bool:
    """True when a call must go through the torch op: under Dynamo, with a torch dispatch
    mode active (make_fx, FakeTensorMode, functionalization), or with proxy/tensor-subclass
    arguments that override ``__torch_function__`` (torch.fx symbolic tracing)."""
    return bool(
        _is_compiling()
        or _dispatch_stack_len()
        or _has_torch_function(args)
        or (kwargs and _has_torch_function(tuple(kwargs.values())))
    )


class Impl:
    """One provider of one op.

    ``impl_fn`` has the native function's parameters. ``supported`` is static (library or
    hardware present). ``supports_args`` (or ``None`` for "every argument") decides per call
    from metadata alone and returns a plain bool. ``inplace`` providers write their outputs
    into the op's activations; ``functional`` is the callable the default overload uses
    (``impl_fn``, or for an in-place provider a wrapper that clones the activations first).
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


def _check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"{kind} name {name!r} is invalid: it must match {NAME_RE.pattern}")
    return name


class IrOp:
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
        # Dispatch cache: one tuple, replaced whole so a reader in another thread always
        # sees a consistent one: (scope stack, registry generation, fast provider or None,
        # Decision, log dispatch, the fast provider's callable). See the module docstring.
        self._cache: tuple = _NO_CACHE
        # (id(config), override) -> (config, generation, Decision, log): decisions by value
        self._decisions: dict[tuple, tuple] = {}
        self._torch: torch_lib.TorchRegistration | None = None
        # The torch.library overloads, set by _register_torch_op (None only before it).
        self.torch_op: Any = None
        self.torch_op_inplace: Any = None

    # ------------------------------------------------------------------ calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Compute the op with the selected provider; never mutates the arguments."""
        # The hot path of every eager call: no avoidable work (docs/design.md#performance-targets).
        if kwargs:
            return self._call_kwargs(args, kwargs)
        if _is_compiling() or _dispatch_stack_len() or _has_torch_function(args):
            return self.torch_op(*args)
        try:  # a try block costs nothing until something raises (CPython 3.11+)
            v = self._validator
            if v is not None:
                v(*args)
            c = self._cache
            if c[0] is not current_scopes() or c[1] != _GENERATION:
                c = self._refresh()
            fn = c[5]
            if fn is None:
                r = c[6]
                # A tuning table's router, called from here (not through _select) when
                # dispatch is not logged: one Python frame less on a routed call.
                impl = r(args) if r is not None and not c[4] else None
                if impl is None:
                    impl = self._select(c, args, None, r is not None and not c[4])
                fn = impl.functional
            return fn(*args)
        except TypeError:
            self._check_arity(args, None)
            raise

    def _call_kwargs(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        if is_tracing(args, kwargs):
            return self.torch_op(*args, **kwargs)
        self.validate(*args, **kwargs)
        return self.dispatch(*args, **kwargs).functional(*args, **kwargs)

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
        self.validate(*args, **kwargs)
        return self.dispatch(*args, **kwargs).impl_fn(*args, **kwargs)

    def dispatch(self, *args: Any, **kwargs: Any) -> Impl:
        """The provider that runs for these arguments (first in the effective priority
        whose ``supports_args`` accepts them). Works on fake tensors.

        Args:
            *args: the op's arguments, as for calling it.
            **kwargs: the op's keyword arguments.

        Returns:
            The chosen `Impl` (``.provider`` names it, ``.impl_fn`` is the function);
                nothing is run.

        Raises:
            TypeError: the arguments do not fit the op's parameters, or a
                ``supports_args`` returned something other than a bool.
            ValueError: a configured priority names an unknown provider.

        Examples:
            >>> import torch
            >>> from opcore.ir import ops
            >>> x, w = torch.ones(2, 8), torch.ones(8)
            >>> with ops.rms_norm.set_priority(["native"]):
            ...     ops.rms_norm.dispatch(x, w, 1e-6).provider
            'native'
        """
        c = self._cache
        if c[0] is not current_scopes() or c[1] != _GENERATION:
            c = self._refresh()
        if c[2] is not None:  # the first provider takes every argument
            return c[2]
        try:
            return self._select(c, args, kwargs)
        except TypeError:
            self._check_arity(args, kwargs)
            raise

    def _select(
        self, c: tuple, args: tuple, kwargs: Mapping[str, Any] | None, asked: bool = False
    ) -> Impl:
        """The provider for ``args``: the tuning table's router first (unless ``asked``:
        the caller asked it already and it declined), then the chain's first that accepts
        them."""
        if c[6] is not None and not kwargs and not asked:  # a table reorders some buckets
            routed = c[6](args)
            if routed is not None:
                if c[4]:
                    _log_dispatch(self, c[3].chain, routed, args, {})
                return routed
        kwargs = kwargs or {}
        for impl in c[3].chain:
            sa = impl.supports_args
            if sa is None:
                break
            ok = sa(*args, **kwargs)
            if ok is True:
                break
            if ok is not False:
                raise TypeError(
                    f"op {self.name!r}: supports_args of provider {impl.provider!r} returned "
                    f"{type(ok).__name__} {ok!r}; it must return a plain bool"
                )
        else:
            # Only a chain cut short by required properties (native lacks them) ends in a
            # provider with supports_args; otherwise the last one takes every argument.
            d = c[3]
            raise priority.MissingPropertyError(
                priority.missing_property_message(self.name, d.required, d.lacking, tried=d.names)
            )
        if c[4]:
            _log_dispatch(self, c[3].chain, impl, args, kwargs)
        return impl

    # ------------------------------------------------------------------ priority
    def priority_override(self) -> tuple[str, ...] | None:
        """The providers of the innermost `set_priority` block of this op open in this
        thread or asyncio task, or ``None``."""
        return _override_in(current_scopes(), self.name)

    def _refresh(self) -> tuple:
        """Rebuild the dispatch cache for this context; returns the new cache tuple.

        Runs whenever a block is entered or left, so the common case (a decision made
        before for this config and list) stays in this frame: every Python call costs,
        and more so under Dynamo's frame hook (a compiled graph's opaque op kernel)."""
        # Read the keys before deciding: a change racing with the decision then only
        # costs one more refresh, never a stale chain.
        scopes, gen = current_scopes(), _GENERATION
        config = override = None
        for frame in reversed(scopes):  # the innermost block of each kind wins
            kind = frame.kind
            if kind == _CONFIG_SCOPE:
                if config is None:
                    config = frame.value
            elif kind == PRIORITY_SCOPE and override is None and frame.value[0] == self.name:
                override = frame.value[1]
        if config is None:
            config = _config.get_current_config()
        key = (id(config), override)
        entry = self._decisions.get(key)
        if entry is None or entry[0] is not config or entry[1] != gen:
            ensure_kernels_loaded()
            gen = _GENERATION  # loading the kernels moves it
            decision = self._decide(config, override)
            entry = (config, gen, decision, log_dispatch_enabled())
            with _registry_lock:
                if len(self._decisions) >= 32:  # bounded: configs made per call come and go
                    self._decisions.clear()
                self._decisions[key] = entry
        decision, log = entry[2], entry[3]
        # A tuning table that measured another provider order for some buckets of this op
        # (docs/tuning.md); None, at no cost per call, when it has none.
        # Not when rows must not depend on the batch: a provider chosen by the token count
        # would compute a row alone and the same row in a batch differently.
        router = (
            None
            if "batch_invariant" in decision.required
            else tuning_runtime.router_for(self.name, decision, self.impls)
        )
        # The first provider takes every argument and nothing is logged: no loop needed.
        first = decision.chain[0]
        fast = first if first.supports_args is None and not log and router is None else None
        # (scope stack, generation, fast Impl, Decision, log, fast Impl's callable,
        # router): the eager call reads the callable itself, one attribute lookup less.
        fn = None if fast is None else fast.functional
        cache = (scopes, gen, fast, decision, log, fn, router)
        self._cache = cache
        return cache

    def _decide(
        self, config: Any, override: tuple[str, ...] | None, platform: Any = None
    ) -> priority.Decision:
        """Gather the inputs of `opcore.ir.priority.decide` (the kernels are loaded), run
        it, and give its warnings (once each)."""
        if platform is None:
            from opcore.platforms import get_current_platform

            platform = get_current_platform()
        configured = config.kernel.ir_op_priority
        defaults: Mapping[str, list[str]] = platform.get_default_ir_op_priority(config) or {}
        for key, message in priority.unknown_op_warnings(
            configured, defaults, platform.name, sorted(_REGISTRY)
        ):
            priority.warn_once(key, message)
        if override is not None:
            user, source = override, priority.USER_SOURCE_BLOCK
        else:
            user, source = configured.get(self.name, ()), priority.USER_SOURCE_CONFIG
        decision = priority.decide(
            self.name,
            self.impls,
            user=user,
            user_source=source,
            platform_default=defaults.get(self.name, ()),
            platform_name=platform.name,
            required=config.kernel.required_properties,
        )
        for key, message in decision.warnings:
            priority.warn_once(key, message)
        return decision

    def decision(self, config: Any = None, *, platform: Any = None) -> priority.Decision:
        """The `opcore.ir.priority.Decision` in effect here: this thread or task's current
        config and `set_priority` block of this op (the dispatch cache's entry). With
        ``config`` (and optionally another ``platform``), the decision for that config
        under the open `set_priority` block, made afresh. The platform's kernels are
        loaded first. Raises ``ValueError`` when the user list names an unknown
        provider."""
        if config is None and platform is None:
            c = self._cache
            if c[0] is not current_scopes() or c[1] != _GENERATION:
                c = self._refresh()
            return c[3]
        ensure_kernels_loaded()
        if config is None:
            config = _config.get_current_config()
        return self._decide(config, self.priority_override(), platform)

    def effective_priority(self, config: Any = None) -> list[str]:
        """The providers tried, in order, under ``config`` (default: the current config):
        user list, then platform default, then ``native`` when needed; providers not
        supported here are left out. The platform's kernels are loaded first, so the
        answer does not depend on whether anything was dispatched before."""
        return list(self.decision(config).names)

    @contextlib.contextmanager
    def set_priority(self, providers: Sequence[str]) -> Iterator[None]:
        """Within the block, use ``providers`` as this op's user priority list (in place
        of the configured one; the platform default and the native rule still apply).

        The block is scoped to the thread or asyncio task that opens it (other threads
        and tasks keep their own priority); blocks may be left in any order. Names are
        checked against the registered providers after the platform's kernels are
        loaded.

        Args:
            providers: provider names, most preferred first.

        Returns:
            A context manager; the previous priority is back when the block is left.

        Raises:
            TypeError: ``providers`` is a single string instead of a list of names.
            ValueError: a name is not a registered provider of this op.

        Examples:
            >>> import torch
            >>> from opcore.ir import ops
            >>> with ops.rms_norm.set_priority(["native"]):
            ...     ops.rms_norm.effective_priority()[0]
            'native'
        """
        if isinstance(providers, str):
            raise TypeError(
                f"op {self.name!r}: set_priority takes a list of provider names, got the "
                f"string {providers!r}"
            )
        providers = tuple(providers)
        ensure_kernels_loaded()
        priority.check_known(self.name, self.impls, providers, source=priority.USER_SOURCE_BLOCK)
        with _PRIORITY_SCOPES.push((self.name, providers)):
            yield

    def explain(self, *args: Any, **kwargs: Any) -> priority.Explanation:
        """Which provider runs for these arguments, and why each other one does not.
        With no arguments, explains the priority only.

        Args:
            *args: the op's arguments, as for calling it (optional).
            **kwargs: the op's keyword arguments (optional).

        Returns:
            The `opcore.ir.priority.Explanation`. Its ``.selected`` is the provider that
                runs (``None`` without arguments), ``.providers`` one row per provider with
                its status and reason; ``str()`` gives a readable report.

        Raises:
            ValueError: a configured priority names an unknown provider.

        Examples:
            >>> import torch
            >>> from opcore.ir import ops
            >>> x, w = torch.ones(2, 8), torch.ones(8)
            >>> with ops.rms_norm.set_priority(["native"]):
            ...     ops.rms_norm.explain(x, w, 1e-6).selected
            'native'
        """
        decision = self.decision()
        explanation = priority.explain(decision, args, kwargs)
        if args and not kwargs:
            c = self._cache
            routed = c[6](args) if c[6] is not None and c[3] is decision else None
            if routed is not None and routed.provider != explanation.selected:
                for row in explanation.providers:
                    if row["provider"] == routed.provider:
                        row["status"], row["reason"] = "selected", "tuning table's order"
                    elif row["provider"] == explanation.selected:
                        row["status"] = "not reached"
                        row["reason"] = f"the tuning table puts {routed.provider!r} first"
                explanation.selected = routed.provider
            explanation.tuning = tuning_runtime.explain_note(self.name, explanation.selected, args)
        return explanation

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
                    default_fn = _cloning_wrapper(fn, self.activation_index, self.activations)
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


def _cloning_wrapper(fn: Callable, indices: tuple[int, ...], names: tuple[str, ...]) -> Callable:
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


def _override_in(frames: tuple, name: str) -> tuple[str, ...] | None:
    """The providers of the innermost `set_priority` block of op ``name`` in ``frames``."""
    for frame in reversed(frames):
        if frame.kind == PRIORITY_SCOPE and frame.value[0] == name:
            return frame.value[1]
    return None


def _log_dispatch(
    op: IrOp, chain: tuple[Impl, ...], impl: Impl, args: tuple, kwargs: Mapping[str, Any]
) -> None:
    shapes = [
        f"{tuple(a.shape)}:{str(a.dtype).removeprefix('torch.')}"
        if isinstance(a, torch.Tensor)
        else repr(a)
        for a in (*args, *kwargs.values())
    ]
    skipped = [p.provider for p in chain[: chain.index(impl)]]
    dispatch_logger.info(
        "%s(%s) -> %s%s",
        op.name,
        ", ".join(shapes),
        impl.provider,
        f" (supports_args rejected: {', '.join(skipped)})" if skipped else "",
    )


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


def unregister_op(name: str) -> None:
    """Remove an op and its torch registration. For tests (`opcore.testing.ir`), not part
    of the public API: compiled code that captured the op keeps a dangling reference."""
    with _registry_lock:
        op = _REGISTRY.pop(name, None)
        if op is None:
            raise KeyError(f"no op named {name!r}")
        op._unregister_torch_op()
        bump_generation()


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


def log_dispatch_enabled() -> bool:
    """``OPCORE_LOG_DISPATCH``: log each dispatch decision on ``opcore.ir.dispatch`` (at
    INFO, to stderr when logging is not configured)."""
    enabled = env_flag("OPCORE_LOG_DISPATCH")
    if enabled:
        dl = dispatch_logger
        if dl.level == logging.NOTSET or dl.level > logging.INFO:
            dl.setLevel(logging.INFO)
        if not dl.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
            dl.addHandler(handler)
    return enabled
