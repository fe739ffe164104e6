"""`CustomOp` and `PluggableLayer`: layers that platforms and plugins can specialise.

One registry, keyed by the stable op name (``"rms_norm"``), holds each in-tree layer class
and at most one out-of-tree replacement::

    @CustomOp.register("rms_norm")
    class RMSNorm(CustomOp): ...

    @RMSNorm.register_oot                   # or CustomOp.register_oot(name="rms_norm")
    class VendorRMSNorm(RMSNorm): ...

    RMSNorm(4096)                           # -> a VendorRMSNorm instance

The replacement must subclass the registered class (its ``__init__`` runs with the same
arguments). It keeps the op name, so ``custom_ops`` entries ``+rms_norm`` / ``-rms_norm``
apply to it as well.

Kernels reach a layer by one route only: ``forward_native`` calls `opcore.ir` ops, and the
platform's provider priority picks each op's kernel. `CustomOp` binds ``forward`` once, at
construction, to

* ``forward_oot`` when the class built is a ``register_oot`` replacement (or a subclass of
  one) that defines it and the ``custom_ops`` rules enable the op: a different structure
  for the whole layer, not a different kernel for an op;
* ``forward_native`` otherwise.

No other ``forward_*`` method is ever called: a `CustomOp` subclass that defines one (the
``forward_<vendor>`` methods of plugin API 1.x) is a `TypeError` when the class is created.
Every binding is logged on ``opcore.layers`` and recorded, with its route, for
`binding_info`. `PluggableLayer` is replaced the same way but has no ``forward_*``
dispatch (and ``custom_ops`` does not apply to it).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, ClassVar

import torch.nn as nn

from opcore import settings
from opcore.config import custom_op_enabled

logger = logging.getLogger("opcore.layers")

# The two forward methods the core binds; any other ``forward_*`` method on a CustomOp is
# a kernel route plugin API 2.0 removed.
BOUND_METHODS = ("forward_native", "forward_oot")

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_")


@dataclasses.dataclass
class _Entry:
    name: str
    base: type
    oot: type | None = None


_registry: dict[str, _Entry] = {}
_lock = threading.RLock()
_bindings: dict[str, dict[str, Any]] = {}


def _check_op_name(name: object) -> str:
    if not isinstance(name, str) or not name or name[0].isdigit() or not set(name) <= _NAME_CHARS:
        raise ValueError(f"layer op name {name!r} is invalid: it must match ^[a-z_][a-z0-9_]*$")
    return name


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class _Replaceable:
    """Registration and out-of-tree replacement shared by `CustomOp` and `PluggableLayer`."""

    op_name: str | None = None

    @classmethod
    def register(cls, name: str):
        """Class decorator: register the decorated class as the in-tree layer ``name``."""
        _check_op_name(name)

        def decorator(layer_cls: type) -> type:
            if not isinstance(layer_cls, type) or not issubclass(layer_cls, cls):
                raise TypeError(
                    f"{cls.__name__}.register({name!r}) decorates a subclass of "
                    f"{cls.__name__}, got {layer_cls!r}"
                )
            with _lock:
                entry = _registry.get(name)
                if entry is not None and entry.base is not layer_cls:
                    raise ValueError(
                        f"layer op name {name!r} is already registered by {_qualname(entry.base)}"
                    )
                _registry[name] = _Entry(name, layer_cls)
            layer_cls.op_name = name
            return layer_cls

        return decorator

    @classmethod
    def register_oot(cls, oot_cls: type | None = None, *, name: str | None = None):
        """Register ``oot_cls`` as the replacement of the layer ``name`` (default: this
        class's op name). Usable as ``@RMSNorm.register_oot``,
        ``@CustomOp.register_oot(name="rms_norm")`` or called directly. Registering the
        same class again is a no-op (general plugins run in every process); a different
        class for the same name is an error.

        Args:
            oot_cls: the replacement class, a subclass of the registered layer's class;
                omitted, a decorator is returned.
            name: the registered layer's op name (default: this class's).

        Returns:
            ``oot_cls``, or a class decorator when it is omitted. Constructing the base
                layer afterwards builds the replacement.

        Raises:
            TypeError: no ``name`` and this class is not a registered layer, the argument
                is not a class, or it does not subclass the layer's class.
            KeyError: no layer is registered under ``name``.
            ValueError: the layer already has a different replacement.

        Examples:
            >>> from opcore.layers import RMSNorm
            >>> @RMSNorm.register_oot
            ... class DocRMSNorm(RMSNorm):
            ...     pass
            >>> type(RMSNorm(8)).__name__
            'DocRMSNorm'
            >>> RMSNorm.unregister_oot()  # undo the example
            >>> type(RMSNorm(8)).__name__
            'RMSNorm'
        """

        def decorator(replacement: type) -> type:
            key = (
                name
                if name is not None
                else cls.__dict__.get("op_name") or getattr(cls, "op_name", None)
            )
            if key is None:
                raise TypeError(
                    f"{cls.__name__}.register_oot needs name= (this class is not a registered "
                    "layer)"
                )
            if not isinstance(replacement, type):
                raise TypeError(f"register_oot decorates a class, got {replacement!r}")
            with _lock:
                entry = _registry.get(key)
                if entry is None:
                    raise KeyError(
                        f"no layer registered as {key!r}; "
                        f"registered: {', '.join(sorted(_registry))}"
                    )
                if not issubclass(replacement, entry.base):
                    raise TypeError(
                        f"replacement {_qualname(replacement)} for layer {key!r} must subclass "
                        f"{_qualname(entry.base)}"
                    )
                if entry.oot is not None and entry.oot is not replacement:
                    raise ValueError(
                        f"layer {key!r} already has the replacement {_qualname(entry.oot)}; "
                        f"cannot also register {_qualname(replacement)}"
                    )
                entry.oot = replacement
            replacement.op_name = key  # type: ignore[attr-defined]  # a _Replaceable subclass
            logger.info(
                "layer %s: %s replaces %s", key, _qualname(replacement), _qualname(entry.base)
            )
            return replacement

        if oot_cls is not None:
            return decorator(oot_cls)
        return decorator

    @classmethod
    def unregister(cls, name: str) -> None:
        """Remove the layer ``name`` and its replacement from the registry (tests)."""
        with _lock:
            if _registry.pop(name, None) is None:
                raise KeyError(f"no layer registered as {name!r}")

    @classmethod
    def unregister_oot(cls, name: str | None = None) -> None:
        """Remove the replacement of layer ``name`` (tests and plugin unloading)."""
        key = name or cls.op_name
        with _lock:
            entry = _registry.get(key) if key else None
            if entry is None or entry.oot is None:
                raise KeyError(f"layer {key!r} has no replacement")
            entry.oot = None

    def __new__(cls, *args: Any, **kwargs: Any):
        name = cls.__dict__.get("op_name")
        if name is not None:
            entry = _registry.get(name)
            if entry is not None and entry.oot is not None and entry.base is cls:
                cls = entry.oot
        return super().__new__(cls)


class CustomOp(_Replaceable, nn.Module):
    """A layer with a pure-PyTorch reference forward that a plugin may replace whole.

    Subclasses implement ``forward_native``, written with `opcore.ir` ops (so each op's
    kernel is chosen by the platform's provider priority) and list those ops in
    ``ir_ops``. A ``register_oot`` replacement may add ``forward_oot``: it runs instead of
    ``forward_native`` while ``custom_ops`` enables the op.

    ``enforce_enable=True`` binds ``forward_oot`` (when the class has one) even when
    ``custom_ops`` disables the op.

    Raises:
        TypeError: at class creation, when the class defines an instance method named
            ``forward_*`` other than ``forward_native`` / ``forward_oot``.
    """

    # The `opcore.ir` ops ``forward_native`` dispatches, for `binding_info` and `opcore info`.
    ir_ops: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        stale = sorted(
            key
            for key, value in vars(cls).items()
            if key.startswith("forward_")
            and key not in BOUND_METHODS
            # static and class methods are helpers (e.g. a shared ``forward_static``),
            # never a forward the core could have bound
            and not isinstance(value, (staticmethod, classmethod))
            and callable(value)
        )
        if stale:
            from opcore.platforms.api_version import MIGRATION_DOC

            raise TypeError(
                f"{_qualname(cls)} defines {', '.join(stale)}: plugin API 2.0 binds only "
                f"forward_native (ops dispatched by provider priority) and a register_oot "
                f"replacement's forward_oot; register the kernel as an opcore.ir provider, or "
                f"rename a helper method ({MIGRATION_DOC})"
            )

    def __init__(self, *, enforce_enable: bool = False):
        super().__init__()
        self._forward_method = self._bind(enforce_enable)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_method(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__qualname__} does not implement forward_native")

    @property
    def bound_method(self) -> str:
        """The name of the ``forward_*`` method this instance runs."""
        return self._forward_method.__name__

    def _bind(self, enforce_enable: bool):
        from opcore.ir import ensure_kernels_loaded
        from opcore.platforms import get_current_platform

        ensure_kernels_loaded()
        platform = get_current_platform()
        cls = type(self)
        name = cls.op_name
        if name is None:
            logger.warning(
                "%s is not registered with CustomOp.register; no custom_ops rule applies to it",
                _qualname(cls),
            )
        config = settings.get_current_config()
        settings.check_pending_names(config, settings.LAYER_OPS)
        method, enabled, reason = resolve_binding(cls, platform, config, enforce_enable)
        record = {
            "op": name,
            "class": _qualname(cls),
            "method": method,
            "enabled": enabled,
            "reason": reason,
            "route": describe_route(cls, method),
            "platform": platform.name,
            "replaces": _replaced_base(cls),
        }
        key = _qualname(cls)
        with _lock:
            previous = _bindings.get(key)
            count = (
                1 if previous is None or _differs(previous, record) else previous["instances"] + 1
            )
            _bindings[key] = {**record, "instances": count}
        log = logger.info if previous is None or _differs(previous, record) else logger.debug
        log("layer %s (%s) -> %s: %s", name, key, record["route"], reason)
        return getattr(self, method)


def resolve_binding(
    cls: type, platform: Any, config: Any, enforce_enable: bool = False
) -> tuple[str, bool, str]:
    """The method an instance of ``cls`` binds to under ``config``: ``(method, enabled,
    reason)``, where ``method`` is ``"forward_oot"`` or ``"forward_native"``. Pure:
    constructs and records nothing. ``platform`` only names the platform in ``reason``: the
    platform chooses kernels through provider priority, never the method.

    Raises:
        opcore.config.ConfigError: ``config.compilation.custom_ops`` breaks its rules.
    """
    name = getattr(cls, "op_name", None)
    if name is None:
        enabled, why = True, "not registered with CustomOp.register: no custom_ops rule applies"
    else:
        enabled, why = custom_op_enabled(config.compilation, name)
    if enforce_enable and not enabled:
        enabled, why = True, why + ", overridden by enforce_enable=True"
    why = f"custom_ops: {why}"
    has_oot = _defines(cls, "forward_oot")
    replacement = _replacement_of(cls)
    if has_oot and replacement is None:
        # Only a registered replacement's forward_oot runs; say so rather than ignore it.
        logger.warning(
            "%s defines forward_oot but is not a register_oot replacement: forward_native runs",
            _qualname(cls),
        )
        ignored = "forward_oot ignored: not a register_oot replacement"
        return "forward_native", enabled, f"{why}; {ignored}"
    if not enabled:
        return "forward_native", False, why
    if has_oot and replacement is not None:
        defines = f"the replacement {_qualname(replacement)} defines forward_oot"
        return "forward_oot", True, f"{why}; {defines}"
    platform_name = getattr(platform, "name", platform)
    priority = f"kernels from platform {platform_name!r} provider priority"
    return "forward_native", True, f"{why}; {priority}"


def describe_route(cls: type, method: str) -> str:
    """How a kernel reaches an instance of ``cls`` bound to ``method``, in one line:
    ``"forward_native -> op rms_norm (priority picks the kernel)"`` or
    ``"register_oot: AcmeRMSNorm (whole-layer replacement), forward_oot"``."""
    if method == "forward_native":
        ops = getattr(cls, "ir_ops", ())
        tail = (
            f"forward_native -> op {', '.join(ops)} (priority picks the kernel)"
            if ops
            else "forward_native (no opcore.ir op declared in ir_ops)"
        )
    else:
        tail = method
    if _replacement_of(cls) is not None:
        return f"register_oot: {cls.__qualname__} (whole-layer replacement), {tail}"
    return tail


def _replacement_of(cls: type) -> type | None:
    """The registered ``register_oot`` replacement ``cls`` is or derives from, if any."""
    with _lock:
        replacements = {e.oot for e in _registry.values() if e.oot is not None}
    return next((k for k in cls.__mro__ if k in replacements), None)


def _defines(cls: type, method: str) -> bool:
    """Whether ``cls`` (or a base below `CustomOp`) defines ``method``."""
    for klass in cls.__mro__:
        if klass is CustomOp:
            return False
        if method in klass.__dict__:
            return True
    return False


def _replaced_base(cls: type) -> str | None:
    name = getattr(cls, "op_name", None)
    entry = _registry.get(name) if name else None
    if entry is not None and entry.oot is cls:
        return _qualname(entry.base)
    return None


def _differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return any(a.get(k) != b.get(k) for k in ("method", "reason", "route", "platform"))


class PluggableLayer(_Replaceable, nn.Module):
    """A layer whose whole module can be replaced by a plugin (``register_oot``), with no
    ``forward_*`` dispatch (attention, linear layers). Construction records which class
    was built for `binding_info`."""

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        key = _qualname(cls)
        with _lock:
            previous = _bindings.get(key)
            _bindings[key] = {
                "op": cls.op_name,
                "class": key,
                "method": "forward",
                "enabled": True,
                "reason": "pluggable layer: replaced by register_oot"
                if _replaced_base(cls)
                else "pluggable layer: in-tree class",
                "route": _pluggable_route(cls),
                "platform": None,
                "replaces": _replaced_base(cls),
                "instances": 1 if previous is None else previous["instances"] + 1,
            }
        if previous is None:
            logger.info(
                "layer %s (%s) constructed%s",
                cls.op_name,
                key,
                f", replacing {_replaced_base(cls)}" if _replaced_base(cls) else "",
            )


def _pluggable_route(cls: type) -> str:
    if _replacement_of(cls) is not None:
        return f"register_oot: {cls.__qualname__} (whole-layer replacement), forward"
    ops = getattr(cls, "ir_ops", ())  # a pluggable layer that calls opcore.ir ops says which
    if ops:
        return f"forward -> op {', '.join(ops)} (priority picks the kernel)"
    return "forward (in-tree class; kernels chosen by the layer, e.g. an attention backend)"


def registered_layers() -> dict[str, tuple[type, type | None]]:
    """Every registered layer name with its in-tree class and its out-of-tree replacement
    (``None`` when not replaced); a snapshot, for the conformance suite and tools."""
    with _lock:
        return {name: (e.base, e.oot) for name, e in sorted(_registry.items())}


def binding_info() -> dict[str, Any]:
    """Per layer class constructed so far: op name, bound method, why, its route (how a
    kernel reaches it, `describe_route`), the platform, the class it replaces (for
    out-of-tree replacements) and how many instances; plus the registry: each op name with
    its in-tree class, replacement, and the method a new instance would bind to here
    (``bound``), its ``route`` and why."""
    from opcore.platforms import get_current_platform

    platform, config = get_current_platform(), settings.get_current_config()
    settings.check_pending_names(config, settings.LAYER_OPS)
    with _lock:
        registry = {}
        for name, e in sorted(_registry.items()):
            built = e.oot or e.base
            if issubclass(built, CustomOp):
                bound, _enabled, why = resolve_binding(built, platform, config)
                route = describe_route(built, bound)
            else:
                bound, why = (
                    "forward",
                    "pluggable layer: whole-module replacement, no forward_* dispatch",
                )
                route = _pluggable_route(built)
            registry[name] = {
                "class": _qualname(e.base),
                "replacement": _qualname(e.oot) if e.oot else None,
                "bound": bound,
                "route": route,
                "why": why,
            }
        return {
            "bindings": {k: dict(v) for k, v in sorted(_bindings.items())},
            "registry": registry,
        }


def _custom_op_names() -> list[str]:
    """The registered layer names that ``custom_ops`` items may name (`CustomOp` layers;
    a `PluggableLayer` has no forward to switch)."""
    with _lock:
        return [n for n, e in sorted(_registry.items()) if issubclass(e.base, CustomOp)]


# Configs' custom_ops names are checked against this registry (the config layer sits below
# the layers and cannot import them).
settings.register_name_source(settings.LAYER_OPS, _custom_op_names)


def clear_binding_records() -> None:
    """Forget the recorded bindings (tests)."""
    with _lock:
        _bindings.clear()
