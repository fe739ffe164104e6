"""Dispatch: which provider computes a call, decided once per setting and signature.

The per-call path of an eager call (docs/design.md#per-call-path), in order:

1. Under tracing (Dynamo, a dispatch mode, proxy arguments) the call is the torch op.
2. The op's `Route` for this context: the decision made for the current config, this op's
   `set_priority` block and the registry generation. It is found by two compares (the
   identity of the scope stack, `opcore.scopes.current_scopes()`, and the generation);
   when either moved, the route is looked up by value (config object, override), so
   blocks that come back to a setting reuse its route, decisions and bound launches.
3. The call's signature (`signature_function`): per tensor its dtype, shape, strides,
   data pointer modulo 16 and device index; per other argument its type and value. A
   signature seen before maps to the callable that served it: the provider's bound
   replay (`Impl.bind`) or its ``functional``. The validator, ``supports_args``, the
   tuning table's router and the provider's launch choices all answered for it already:
   they read nothing else.
4. Otherwise the full path: validate, choose the provider (router, then the chain's first
   whose ``supports_args`` accepts), run it (binding it when it can bind), remember the
   signature's callable.

The generation (`bump_generation`) moves when providers or ops are registered or removed,
kernels load, a tuning table is loaded, or `invalidate_caches()` is called: every route
is made afresh, with an empty signature map. Logged dispatch (``OPCORE_LOG_DISPATCH``)
takes the full path on every call.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from opcore import settings as _settings
from opcore.env import env_flag
from opcore.ir import priority, registry, tuning_sources
from opcore.ir.impl import Impl
from opcore.ir.signature import parameter_kinds, signature_function
from opcore.platforms.kernels import ensure_kernels_loaded, on_kernels_loaded
from opcore.scopes import ScopeKind, current_scopes
from opcore.tuning import runtime as tuning_runtime

dispatch_logger = logging.getLogger("opcore.ir.dispatch")

# Bumped on every change that can alter a dispatch decision other than the config and the
# set_priority scopes (those are per thread / task and looked up by value instead).
_GENERATION = 0
_lock = threading.RLock()

PRIORITY_SCOPE = "ir_priority"  # the `opcore.scopes.Frame.kind` of set_priority blocks
_PRIORITY_SCOPES = ScopeKind(PRIORITY_SCOPE)
_CONFIG_SCOPE = _settings.CONFIG_SCOPE
# Most signatures a route remembers, and most routes an op keeps, before starting over.
MAX_SIGNATURES = 1024
MAX_ROUTES = 32

# Bound once: these run on every eager call. Dynamo folds is_dynamo_compiling() to True
# while tracing; export and AOT tracing run under a dispatch mode (second check).
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_has_torch_function = torch._C._has_torch_function


def bump_generation() -> None:
    """Invalidate every op's routes (and compiled graphs' cache keys)."""
    global _GENERATION
    _GENERATION += 1


# Decisions made while the kernels were loading saw a partial registry.
on_kernels_loaded(bump_generation)

# registry_generation(): the counter `bump_generation` moves. A C-level callable (no
# Python frame): compiled graphs call it on every call, where Dynamo's frame hook makes
# each Python frame cost about a microsecond.
registry_generation = functools.partial(getattr, sys.modules[__name__], "_GENERATION")


# The tuning index sits below this layer: it reads the registry, the environment and the
# config through `tuning_sources`, and moves the generation when its tables change.
tuning_sources.connect(registry_generation, bump_generation)


def invalidate_caches() -> None:
    """Drop every op's routes and bound launches (call after mutating the current config's
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


def priority_overrides(frames: tuple | None = None) -> dict[str, tuple[str, ...]]:
    """``{op name: providers}`` of the `set_priority` blocks open in this thread or task
    (``frames``: an `opcore.scopes.current_scopes()` value; default: the current one). The
    innermost block of an op wins."""
    return dict(_PRIORITY_SCOPES.values(frames))


# --------------------------------------------------------------------------- routes
class Route:
    """What an op's eager calls do in one setting: the `priority.Decision` for a config and
    a `set_priority` list at one registry generation, the tuning table's router, and the
    callable each call signature was served by (``bound``)."""

    __slots__ = (
        "bound",
        "bound_inplace",
        "config",
        "decision",
        "direct",
        "first",
        "generation",
        "keyed",
        "log",
        "router",
    )

    def __init__(
        self,
        config: Any,
        generation: int,
        decision: priority.Decision,
        log: bool,
        impls: Mapping[str, Impl],
    ):
        self.config = config
        self.generation = generation
        self.decision = decision
        self.log = log
        # A tuning table that measured another provider order for some buckets of this
        # op (docs/tuning.md); None when it has none. Not when rows must not depend on the
        # batch: a provider chosen by the token count would compute a row alone and the
        # same row in a batch differently.
        self.router = (
            None
            if "batch_invariant" in decision.required
            else tuning_runtime.router_for(decision.op, decision, impls)
        )
        first = decision.chain[0]
        # The chain's first, when it takes every argument and no table reroutes: then
        # `dispatch` needs no arguments.
        self.first = first if first.supports_args is None and self.router is None else None
        # When that provider cannot bind either and nothing is logged, a call needs no
        # signature: the validator, then the provider (the cheapest path there is).
        self.direct = (
            first.functional if self.first is not None and first.bind is None and not log else None
        )
        # A signature pays where it skips more than it costs: a provider that binds (its
        # launch choices, Triton's binder). Without one in the chain, a call is checked and
        # chosen as it comes (validator, router, supports_args), which costs less.
        self.keyed = any(i.bind is not None for i in decision.chain)
        self.bound: dict[tuple, Callable] = {}  # the default overload's, per signature
        self.bound_inplace: dict[tuple, Callable] = {}  # maybe_inplace's


class _Cached:
    """An op's route for one scope stack (replaced whole, so a reader in another thread
    sees a matching pair)."""

    __slots__ = ("route", "scopes")

    def __init__(self, scopes: tuple, route: Route | None):
        self.scopes = scopes
        self.route = route


_EMPTY = _Cached((), None)


class _PriorityBlock:
    """The context manager `Dispatcher.set_priority` returns (a class, not a generator:
    entering and leaving a block is on the per-call path of code that opens one per call)."""

    __slots__ = ("_frame", "_mine", "_token", "value")

    def __init__(self, value: tuple[str, tuple[str, ...]]):
        self.value = value

    def __enter__(self) -> None:
        self._frame, self._mine, self._token = _PRIORITY_SCOPES.enter(self.value)

    def __exit__(self, *exc: object) -> None:
        _PRIORITY_SCOPES.leave(self._frame, self._mine, self._token)


class Dispatcher:
    """The dispatch half of `opcore.ir.op.IrOp`: calling, choosing a provider, priority
    blocks and explanations. Its state is the route cache; the op supplies ``name``,
    ``impls``, ``native``, ``torch_op`` and the validator."""

    name: str
    impls: dict[str, Impl]
    torch_op: Any
    param_names: tuple[str, ...]
    _validator: Callable[..., None] | None

    def _init_dispatch(self, parameters: Sequence[inspect.Parameter]) -> None:
        self._cache = _EMPTY
        # (id(config), override) -> Route: decisions by value
        self._routes: dict[tuple, Route] = {}
        n_required = sum(1 for p in parameters if p.default is p.empty)
        self._call_signature = signature_function(parameter_kinds(parameters), n_required)
        # set_priority lists checked at this generation
        self._checked: dict[tuple[str, ...], int] = {}

    # ------------------------------------------------------------------ calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Compute the op with the selected provider; never mutates the arguments."""
        # The hot path of every eager call: no avoidable work (see the module docstring).
        if kwargs:
            return self._call_kwargs(args, kwargs)
        if _is_compiling() or _dispatch_stack_len() or _has_torch_function(args):
            return self.torch_op(*args)
        c = self._cache
        route = c.route
        if c.scopes is not current_scopes() or route is None or route.generation != _GENERATION:
            route = self._refresh()
        direct = route.direct
        if direct is not None:
            try:  # a try block costs nothing until something raises (CPython 3.11+)
                v = self._validator
                if v is not None:
                    v(*args)
                return direct(*args)
            except TypeError:
                self._check_arity(args, None)
                raise
        if not route.keyed:
            try:
                v = self._validator
                if v is not None:
                    v(*args)
                return self._select(route, args, None).functional(*args)
            except TypeError:
                self._check_arity(args, None)
                raise
        try:
            fn = route.bound[self._call_signature(args)]
        except Exception:  # unseen signature, or arguments that have none
            return self._call_full(route, args)
        return fn(*args)

    def _call_inplace(self, args: tuple) -> Any:
        """`maybe_inplace` without keyword arguments: the per-call path of ``__call__``, for
        the providers' in-place functions."""
        c = self._cache
        route = c.route
        if c.scopes is not current_scopes() or route is None or route.generation != _GENERATION:
            route = self._refresh()
        try:
            fn = route.bound_inplace[self._call_signature(args)]
        except Exception:  # unseen signature, or arguments that have none
            return self._call_full(route, args, inplace=True)
        return fn(*args)

    def _call_full(self, route: Route, args: tuple, inplace: bool = False) -> Any:
        """The full path: validate, choose, run (binding the provider where it can), and
        remember the signature's callable."""
        try:
            v = self._validator
            if v is not None:
                v(*args)
            impl = self._select(route, args, None)
        except TypeError:
            self._check_arity(args, None)
            raise
        call = impl.impl_fn if inplace else impl.functional
        if route.log:
            return call(*args)
        try:
            key = self._call_signature(args)
        except Exception:  # no signature (unhashable or unusual arguments): not remembered
            return call(*args)
        bind = impl.bind
        if bind is None:
            result, fn = call(*args), call
        else:
            result, replay = bind(call)(*args)
            fn = call if replay is None else replay
        bound = route.bound_inplace if inplace else route.bound
        if len(bound) >= MAX_SIGNATURES:  # bounded: a run of ever new shapes
            bound.clear()
        try:
            bound[key] = fn
        except TypeError:  # an unhashable value inside the signature
            pass
        return result

    def _call_kwargs(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        if is_tracing(args, kwargs):
            return self.torch_op(*args, **kwargs)
        self.validate(*args, **kwargs)
        return self.dispatch(*args, **kwargs).functional(*args, **kwargs)

    def _check_arity(self, args: tuple, kwargs: Mapping[str, Any] | None) -> None:
        raise NotImplementedError  # IrOp's

    def validate(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError  # IrOp's

    def dispatch(self, *args: Any, **kwargs: Any) -> Impl:
        """The provider that runs for these arguments (first in the effective priority
        whose ``supports_args`` accepts them, unless the tuning table routes the bucket to
        another). Works on fake tensors.

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
        route = self.route()
        if route.first is not None:
            return route.first
        try:
            return self._select(route, args, kwargs)
        except TypeError:
            self._check_arity(args, kwargs)
            raise

    def _select(self, route: Route, args: tuple, kwargs: Mapping[str, Any] | None) -> Impl:
        """The provider for ``args``: the tuning table's router first, then the chain's
        first that accepts them."""
        if route.router is not None and not kwargs:  # a table reorders some buckets
            routed = route.router(args)
            if routed is not None:
                if route.log:
                    _log_dispatch(self.name, route.decision.chain, routed, args, {})
                return routed
        kwargs = kwargs or {}
        decision = route.decision
        for impl in decision.chain:
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
            raise priority.MissingPropertyError(
                priority.missing_property_message(
                    self.name, decision.required, decision.lacking, tried=decision.names
                )
            )
        if route.log:
            _log_dispatch(self.name, decision.chain, impl, args, kwargs)
        return impl

    # ------------------------------------------------------------------ priority
    def route(self) -> Route:
        """The `Route` in effect in this thread or task (made when first needed)."""
        c = self._cache
        route = c.route
        if c.scopes is not current_scopes() or route is None or route.generation != _GENERATION:
            route = self._refresh()
        return route

    def priority_override(self) -> tuple[str, ...] | None:
        """The providers of the innermost `set_priority` block of this op open in this
        thread or asyncio task, or ``None``."""
        return _override_in(current_scopes(), self.name)

    def _refresh(self) -> Route:
        """Find (or make) the route for this context and cache it with the scope stack.

        Runs whenever a block is entered or left, so the common case (a route made before
        for this config and list) stays in this frame."""
        # Read the keys before deciding: a change racing with the decision then only
        # costs one more refresh, never a stale route.
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
            config = _settings.get_current_config()
        key = (id(config), override)
        route = self._routes.get(key)
        if route is None or route.config is not config or route.generation != gen:
            ensure_kernels_loaded()
            gen = _GENERATION  # loading the kernels moves it
            decision = self._decide(config, override)
            route = Route(config, gen, decision, log_dispatch_enabled(), self.impls)
            gen = _GENERATION  # the router's table load may move it once more
            route.generation = gen
            with _lock:
                if len(self._routes) >= MAX_ROUTES:  # bounded: configs made per call
                    self._routes.clear()
                self._routes[key] = route
        self._cache = _Cached(scopes, route)
        return route

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
            configured, defaults, platform.name, registry.op_names()
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
        config and `set_priority` block of this op (the route's). With ``config`` (and
        optionally another ``platform``), the decision for that config under the open
        `set_priority` block, made afresh. The platform's kernels are loaded first.
        Raises ``ValueError`` when the user list names an unknown provider."""
        if config is None and platform is None:
            return self.route().decision
        ensure_kernels_loaded()
        if config is None:
            config = _settings.get_current_config()
        return self._decide(config, self.priority_override(), platform)

    def effective_priority(self, config: Any = None) -> list[str]:
        """The providers tried, in order, under ``config`` (default: the current config):
        user list, then platform default, then ``native`` when needed; providers not
        supported here are left out. The platform's kernels are loaded first, so the
        answer does not depend on whether anything was dispatched before."""
        return list(self.decision(config).names)

    def set_priority(self, providers: Sequence[str]) -> _PriorityBlock:
        """Within the block, use ``providers`` as this op's user priority list (in place
        of the configured one; the platform default and the native rule still apply).

        The block is scoped to the thread or asyncio task that opens it (other threads
        and tasks keep their own priority); blocks may be left in any order. Names are
        checked against the registered providers after the platform's kernels are
        loaded. A block whose list was seen before costs no new decision: the op's route
        for it (and the launches bound under it) is reused.

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
        if self._checked.get(providers) != _GENERATION:
            ensure_kernels_loaded()
            priority.check_known(
                self.name, self.impls, providers, source=priority.USER_SOURCE_BLOCK
            )
            if len(self._checked) >= MAX_ROUTES:
                self._checked.clear()
            self._checked[providers] = _GENERATION
        return _PriorityBlock((self.name, providers))

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
        route = self.route()
        decision = route.decision
        explanation = priority.explain(decision, args, kwargs)
        if args and not kwargs:
            routed = route.router(args) if route.router is not None else None
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


def _override_in(frames: tuple, name: str) -> tuple[str, ...] | None:
    """The providers of the innermost `set_priority` block of op ``name`` in ``frames``."""
    for frame in reversed(frames):
        if frame.kind == PRIORITY_SCOPE and frame.value[0] == name:
            return frame.value[1]
    return None


def _log_dispatch(
    name: str, chain: tuple[Impl, ...], impl: Impl, args: tuple, kwargs: Mapping[str, Any]
) -> None:
    shapes = [
        f"{tuple(a.shape)}:{str(a.dtype).removeprefix('torch.')}"
        if isinstance(a, torch.Tensor)
        else repr(a)
        for a in (*args, *kwargs.values())
    ]
    skipped = [p.provider for p in chain[: chain.index(impl)]] if impl in chain else []
    dispatch_logger.info(
        "%s(%s) -> %s%s",
        name,
        ", ".join(shapes),
        impl.provider,
        f" (supports_args rejected: {', '.join(skipped)})" if skipped else "",
    )


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
