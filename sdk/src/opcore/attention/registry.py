"""Attention backend names and the class path behind each.

The core knows a fixed set of names. Some have an implementation in the SDK
(``TORCH_NATIVE``, ``TRITON_PAGED``); the others are reserved for platform plugins, which
attach an implementation with `register_backend`:

    register_backend("ASCEND", "opcore_plugin_ascend.attention.AscendBackend")

A plugin may also register a brand-new name, or override the path of an existing one
(its platform then gets the plugin's class whenever that name is selected). Overrides
are kept apart from the defaults, so `clear_override` restores the SDK's path and
`registered_backends` shows which names are overridden. Registration is usually done in
an ``opcore.general_plugins`` entry point, which the selector runs before it selects.

Names are upper-case identifiers; lookups are case-insensitive.
"""

from __future__ import annotations

import re
import threading
from typing import Any

_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")

# The SDK's own paths. None: reserved for a plugin to register.
_DEFAULTS: dict[str, str | None] = {
    "TORCH_NATIVE": "opcore.attention.backends.torch_native.TorchNativeBackend",
    "TRITON_PAGED": "opcore.attention.backends.triton_paged.TritonPagedBackend",
    "FLASH_ATTN": None,
    "FLASHINFER": None,
    "ROCM_ATTN": None,
    "XPU_ATTN": None,
    "CPU_ATTN": None,
    "ASCEND": None,
    "PALLAS": None,
    "CUSTOM": None,
}

_lock = threading.Lock()
_overrides: dict[str, str] = {}
_generation = 0


class UnknownBackendError(ValueError):
    """A backend name that is neither a known name nor registered by a plugin."""


def registry_generation() -> int:
    """Bumped on every registration change; selection caches key on it."""
    return _generation


def normalize_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name.upper()):
        raise ValueError(f"attention backend name {name!r} is not an identifier such as 'TRITON_PAGED'")
    return name.upper()


def known_names() -> list[str]:
    """Every name: the SDK's, then names plugins added, in registration order."""
    return list(_DEFAULTS) + [n for n in _overrides if n not in _DEFAULTS]


def register_backend(name: str, class_path: str | None = None) -> Any:
    """Attach ``class_path`` (``"package.module.Class"``) to backend ``name``, adding the
    name if it is new or overriding its path if it exists. Without ``class_path`` it is a
    class decorator that registers the decorated class's own path::

        @register_backend("CUSTOM")
        class MyBackend(AttentionBackend): ...

    Idempotent for the same path; a later registration of another path wins (it is an
    override, logged by the selector through `registered_backends`)."""
    key = normalize_name(name)

    def _set(path: str) -> None:
        global _generation
        module, _, attr = path.rpartition(".")
        if not module or not attr:
            raise ValueError(f"register_backend({key!r}): {path!r} is not a dotted path 'package.module.Class'")
        with _lock:
            if _overrides.get(key) != path:
                _overrides[key] = path
                _generation += 1

    if class_path is not None:
        _set(class_path)
        return None

    def decorator(cls: type) -> type:
        _set(f"{cls.__module__}.{cls.__qualname__}")
        return cls

    return decorator


def clear_override(name: str) -> None:
    """Remove a plugin's registration of ``name`` (back to the SDK's path, or gone if the
    plugin had added the name)."""
    global _generation
    key = normalize_name(name)
    with _lock:
        if _overrides.pop(key, None) is not None:
            _generation += 1


def is_overridden(name: str) -> bool:
    return normalize_name(name) in _overrides


def backend_class_path(name: str) -> str:
    """The dotted class path registered for ``name``. Raises `UnknownBackendError` for a
    name nobody declared, and ``ValueError`` for a reserved name with no implementation
    registered yet."""
    key = normalize_name(name)
    if key in _overrides:
        return _overrides[key]
    if key not in _DEFAULTS:
        raise UnknownBackendError(
            f"Unknown attention backend {name!r}. Known backends: {', '.join(known_names())}"
        )
    path = _DEFAULTS[key]
    if path is None:
        raise ValueError(
            f"Attention backend {key} has no implementation registered: a plugin provides it with "
            f"opcore.attention.register_backend({key!r}, 'package.module.Class')"
        )
    return path


def registered_backends() -> dict[str, dict[str, Any]]:
    """``{name: {"class_path": path or None, "overridden": bool}}`` for every name."""
    out = {}
    for key in known_names():
        out[key] = {
            "class_path": _overrides.get(key, _DEFAULTS.get(key)),
            "overridden": key in _overrides,
            "default_class_path": _DEFAULTS.get(key),
        }
    return out


def load_backend_class(class_path: str) -> type:
    """Import ``class_path`` and check that it is an `AttentionBackend` subclass."""
    from opcore.attention.backend import AttentionBackend
    from opcore.plugins import resolve_qualname

    obj = resolve_qualname(class_path)
    if not isinstance(obj, type) or not issubclass(obj, AttentionBackend):
        raise TypeError(f"{class_path} is not an opcore.attention.AttentionBackend subclass")
    return obj

