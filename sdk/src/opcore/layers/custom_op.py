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

`CustomOp` binds ``forward`` once, at construction: when the op is enabled by the
``custom_ops`` rules, to the first method of the platform's ``custom_op_forward_chain``
that the class defines (``forward_native`` ends every chain); when it is disabled, to
``forward_native``. Every binding is logged on ``opcore.layers`` and recorded for
`binding_info`. `PluggableLayer` is replaced the same way but has no ``forward_*``
dispatch (and ``custom_ops`` does not apply to it).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import torch.nn as nn

from opcore.config import get_current_config

logger = logging.getLogger("opcore.layers")

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
                    f"{cls.__name__}.register({name!r}) decorates a subclass of {cls.__name__}, got {layer_cls!r}"
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
        class for the same name is an error."""

        def decorator(replacement: type) -> type:
            key = (
                name
                if name is not None
                else cls.__dict__.get("op_name") or getattr(cls, "op_name", None)
            )
            if key is None:
                raise TypeError(
                    f"{cls.__name__}.register_oot needs name= (this class is not a registered layer)"
                )
            if not isinstance(replacement, type):
                raise TypeError(f"register_oot decorates a class, got {replacement!r}")
            with _lock:
                entry = _registry.get(key)
                if entry is None:
                    raise KeyError(
                        f"no layer registered as {key!r}; registered: {', '.join(sorted(_registry))}"
                    )
                if not issubclass(replacement, entry.base):
                    raise TypeError(
                        f"replacement {_qualname(replacement)} for layer {key!r} must subclass {_qualname(entry.base)}"
                    )
                if entry.oot is not None and entry.oot is not replacement:
                    raise ValueError(
                        f"layer {key!r} already has the replacement {_qualname(entry.oot)}; "
                        f"cannot also register {_qualname(replacement)}"
                    )
                entry.oot = replacement
            replacement.op_name = key
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
            entry = _registry.get(key)
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


def _custom_ops_enabled(name: str, config: Any) -> tuple[bool, str]:
    """Whether op ``name`` is enabled by ``config.compilation.custom_ops``, and why."""
    items = list(config.compilation.custom_ops)
    bases = [i for i in items if i in ("all", "none")]
    if len(bases) > 1:
        raise ValueError(
            f"custom_ops {items!r}: more than one base; use exactly one of 'all' / 'none'"
        )
    plus, minus = f"+{name}" in items, f"-{name}" in items
    if plus and minus:
        raise ValueError(f"custom_ops {items!r}: both '+{name}' and '-{name}' given")
    if bases:
        base, base_why = bases[0], f"base {bases[0]!r}"
    else:
        base = "none" if config.compilation.mode == "inductor" else "all"
        base_why = f"default base {base!r} for mode {config.compilation.mode!r}"
    if minus:
        return False, f"disabled by '-{name}'"
    if plus:
        return True, f"enabled by '+{name}'"
    return base == "all", base_why


class CustomOp(_Replaceable, nn.Module):
    """A layer whose forward differs per platform. Subclasses implement
    ``forward_native`` (pure PyTorch or `opcore.ir` ops) and may add ``forward_cuda``,
    ``forward_hip``, ``forward_xpu``, ``forward_cpu``, ``forward_tpu``, ``forward_oot``.

    ``enforce_enable=True`` binds by the forward chain even when ``custom_ops`` disables
    the op."""

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
                "%s is not registered with CustomOp.register; binding by the forward chain",
                _qualname(cls),
            )
        method, enabled, reason = resolve_binding(
            cls, platform, get_current_config(), enforce_enable
        )
        record = {
            "op": name,
            "class": _qualname(cls),
            "method": method,
            "enabled": enabled,
            "reason": reason,
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
        log("layer %s (%s) -> %s: %s", name, key, method, reason)
        return getattr(self, method)


def resolve_binding(
    cls: type, platform: Any, config: Any, enforce_enable: bool = False
) -> tuple[str, bool, str]:
    """The ``forward_*`` method an instance of ``cls`` binds to on ``platform`` under
    ``config``: ``(method, enabled, reason)``. Pure: constructs and records nothing."""
    name = getattr(cls, "op_name", None)
    if name is None:
        enabled, why = True, "not registered with CustomOp.register: no custom_ops rule applies"
    else:
        enabled, why = _custom_ops_enabled(name, config)
    if enforce_enable and not enabled:
        enabled, why = True, why + ", overridden by enforce_enable=True"
    chain = tuple(platform.custom_op_forward_chain)
    if not enabled:
        return "forward_native", False, f"custom_ops: {why}"
    method = next((m for m in chain if _defines(cls, m)), "forward_native")
    reason = f"custom_ops: {why}; first of platform {platform.name!r} chain {list(chain)} defined by the class"
    return method, True, reason


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
    return any(a.get(k) != b.get(k) for k in ("method", "reason", "platform"))


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


def registered_layers() -> dict[str, tuple[type, type | None]]:
    """Every registered layer name with its in-tree class and its out-of-tree replacement
    (``None`` when not replaced); a snapshot, for the conformance suite and tools."""
    with _lock:
        return {name: (e.base, e.oot) for name, e in sorted(_registry.items())}


def binding_info() -> dict[str, Any]:
    """Per layer class constructed so far: op name, bound method, why, the platform, the
    class it replaces (for out-of-tree replacements) and how many instances; plus the
    registry: each op name with its in-tree class, replacement, and the method a new
    instance would bind to here (``bound``) and why."""
    from opcore.platforms import get_current_platform

    platform, config = get_current_platform(), get_current_config()
    with _lock:
        registry = {}
        for name, e in sorted(_registry.items()):
            built = e.oot or e.base
            if issubclass(built, CustomOp):
                bound, _enabled, why = resolve_binding(built, platform, config)
            else:
                bound, why = (
                    "forward",
                    "pluggable layer: whole-module replacement, no forward_* dispatch",
                )
            registry[name] = {
                "class": _qualname(e.base),
                "replacement": _qualname(e.oot) if e.oot else None,
                "bound": bound,
                "why": why,
            }
        return {
            "bindings": {k: dict(v) for k, v in sorted(_bindings.items())},
            "registry": registry,
        }


def clear_binding_records() -> None:
    """Forget the recorded bindings (tests)."""
    with _lock:
        _bindings.clear()
