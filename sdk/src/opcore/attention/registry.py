"""Attention backend names and the one class behind each.

The registry is the only route from a backend name to a class: the selector, the
conformance suite, `opcore info` and ``OPCORE_ATTENTION_BACKEND`` all read it, and no
platform hook maps names on the side.

The core registers its own backends, ``TORCH_NATIVE`` (the reference, any device) and
``TRITON_PAGED`` (Triton kernels). It reserves no other name. A platform plugin registers
its backends from its ``import_kernels`` hook, which runs once, only when that platform is
the current one, before any selection::

    def import_kernels(self):
        register_backend("ACME_PAGED", "opcore_plugin_acme.attention.AcmePagedBackend")

and names them in ``get_attn_backend_candidates``, in priority order.

A name has exactly one class: registering a core name, or a name already registered to
another path, is an error (registering the same path again is a no-op). To change what a
platform uses, register a new name and list it first.

Names are upper-case identifiers; lookups are case-insensitive.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from opcore import settings

if TYPE_CHECKING:
    from opcore.attention.backend import AttentionBackend

_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")

# The core's own backends. Generic names only: a backend tied to one vendor's hardware or
# library belongs to that vendor's plugin, which registers it.
CORE_BACKENDS: dict[str, str] = {
    "TORCH_NATIVE": "opcore.attention.backends.torch_native.TorchNativeBackend",
    "TRITON_PAGED": "opcore.attention.backends.triton_paged.TritonPagedBackend",
}

_lock = threading.Lock()
_registered: dict[str, str] = {}  # plugin names -> class paths, in registration order
_generation = 0


class UnknownBackendError(ValueError):
    """A backend name that neither the core nor a loaded plugin registered."""


def registry_generation() -> int:
    """Bumped on every registration change; selection caches key on it."""
    return _generation


def normalize_name(name: str) -> str:
    """``name`` in upper case; ``ValueError`` when it is not an identifier."""
    if not isinstance(name, str) or not _NAME.match(name.upper()):
        raise ValueError(
            f"attention backend name {name!r} is not an identifier such as 'TRITON_PAGED'"
        )
    return name.upper()


def known_names() -> list[str]:
    """Every registered name: the core's, then the plugins', in registration order."""
    with _lock:
        return list(CORE_BACKENDS) + list(_registered)


# Configs' attention.backend is checked against this registry (the config layer sits below
# attention and cannot import it).
settings.register_name_source(settings.ATTENTION_BACKENDS, known_names)


def register_backend(name: str, class_path: str | None = None) -> Any:
    """Register backend ``name`` with the class at ``class_path`` (``"pkg.module.Class"``).

    Call it from your platform's ``import_kernels`` hook; list the name in
    ``get_attn_backend_candidates`` so the selector tries it. Only the path is stored: the
    class is imported when the name is selected.

    Without ``class_path`` it is a class decorator registering the decorated class::

        @register_backend("ACME_PAGED")
        class AcmePagedBackend(TorchNativeBackend): ...

    Args:
        name: an identifier, any case (stored upper-case).
        class_path: dotted path of an `opcore.attention.AttentionBackend` subclass.

    Returns:
        ``None``; the decorator when ``class_path`` is omitted.

    Raises:
        ValueError: ``name`` is not an identifier, ``class_path`` is not dotted, ``name`` is
            a core backend, or ``name`` is already registered to a different path.

    Examples:
        >>> from opcore.attention import known_names, register_backend
        >>> from opcore.testing.attention import unregister_backend
        >>> path = "opcore.attention.backends.torch_native.TorchNativeBackend"
        >>> register_backend("doc_paged", path)
        >>> "DOC_PAGED" in known_names()
        True
        >>> unregister_backend("DOC_PAGED")  # undo the example
    """
    key = normalize_name(name)

    def _set(path: str) -> None:
        global _generation
        module, _, attr = path.rpartition(".")
        if not module or not attr:
            raise ValueError(
                f"register_backend({key!r}): {path!r} is not a dotted path 'package.module.Class'"
            )
        if key in CORE_BACKENDS:
            raise ValueError(
                f"register_backend({key!r}, {path!r}): {key} is a core attention backend "
                f"({CORE_BACKENDS[key]}); register your class under a name of its own and list "
                "it first in your platform's get_attn_backend_candidates"
            )
        with _lock:
            current = _registered.get(key)
            if current == path:
                return
            if current is not None:
                raise ValueError(
                    f"register_backend({key!r}, {path!r}): {key} is already registered to "
                    f"{current}; a backend name has one class"
                )
            _registered[key] = path
            _generation += 1

    if class_path is not None:
        _set(class_path)
        return None

    def decorator(cls: type) -> type:
        if "<locals>" in cls.__qualname__:
            # The selector imports the class by its path; a function's local class has none.
            raise ValueError(
                f"register_backend({key!r}): {cls.__qualname__} is defined inside a function "
                "and cannot be imported by its path; define it at module level"
            )
        _set(f"{cls.__module__}.{cls.__qualname__}")
        return cls

    return decorator


def unregister_backend(name: str) -> None:
    """Forget a plugin's registration of ``name``; a core name cannot be removed, an unknown
    name is ignored. Outside tests a name, once registered, stays for the process (configs
    were checked against it, layers hold the class it selected), so this is not API: tests
    reach it through `opcore.testing.attention`, and `opcore.attention` does not export it."""
    global _generation
    key = normalize_name(name)
    if key in CORE_BACKENDS:
        raise ValueError(f"{key} is a core attention backend and cannot be unregistered")
    with _lock:
        if _registered.pop(key, None) is not None:
            _generation += 1


def backend_class_path(name: str) -> str:
    """The dotted class path registered for ``name``.

    Raises:
        UnknownBackendError: nobody registered ``name`` (the message lists the known ones).
        ValueError: ``name`` is not an identifier.
    """
    key = normalize_name(name)
    if key in CORE_BACKENDS:
        return CORE_BACKENDS[key]
    with _lock:
        path = _registered.get(key)
    if path is None:
        raise UnknownBackendError(
            f"Unknown attention backend {name!r}. Known backends: {', '.join(known_names())}"
        )
    return path


def registered_backends() -> dict[str, dict[str, Any]]:
    """``{name: {"class_path": path, "origin": "core" or "plugin"}}`` for every name."""
    out: dict[str, dict[str, Any]] = {
        key: {"class_path": path, "origin": "core"} for key, path in CORE_BACKENDS.items()
    }
    with _lock:
        for key, path in _registered.items():
            out[key] = {"class_path": path, "origin": "plugin"}
    return out


def load_backend_class(class_path: str) -> type[AttentionBackend]:
    """Import ``class_path`` and check that it is an `AttentionBackend` subclass."""
    from opcore.attention.backend import AttentionBackend
    from opcore.plugins import resolve_qualname

    obj = resolve_qualname(class_path)
    if not isinstance(obj, type) or not issubclass(obj, AttentionBackend):
        raise TypeError(f"{class_path} is not an opcore.attention.AttentionBackend subclass")
    return obj
