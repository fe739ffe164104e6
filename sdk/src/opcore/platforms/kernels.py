"""Loading the current platform's kernels, once per process.

``ensure_kernels_loaded()`` calls the current platform's ``import_kernels()``, then its
``import_ir_kernels()``, then runs the general plugins. Everything that asks whether a
name is registered (op providers, layers, attention backends) calls it first, so the answer
never depends on whether something was dispatched before.

This module sits beside platform resolution and knows nothing of what the kernels
register: code that caches decisions built on the registries (`opcore.ir`) subscribes with
`on_kernels_loaded` and is told when loading has finished.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable

logger = logging.getLogger("opcore.platforms")


class KernelLoadWarning(UserWarning):
    """A platform's kernel hook failed; the providers it would have registered are
    missing."""


_lock = threading.RLock()
_loaded = False
_loading = False
_errors: list[str] = []
_listeners: list[Callable[[], None]] = []


def on_kernels_loaded(callback: Callable[[], None]) -> None:
    """Call ``callback()`` each time a load finishes (registries changed)."""
    _listeners.append(callback)


def kernels_loaded() -> bool:
    return _loaded


def ensure_kernels_loaded() -> None:
    """Import the current platform's kernels and IR providers and run the general plugins,
    once per process. A failing hook is recorded (see `kernel_load_errors`) and warned
    about (`KernelLoadWarning`); ``OPCORE_STRICT_PLUGINS=1`` makes it fatal. A kernel
    module that dispatches while it is being imported returns at once (the load is under
    way in this thread)."""
    global _loaded, _loading
    if _loaded:
        return
    with _lock:
        if _loading:
            # This thread is inside the load: a kernel module dispatching while it is
            # imported goes on; a general plugin doing so is an error naming it.
            from opcore.plugins import refuse_reentry_from_general_plugin

            refuse_reentry_from_general_plugin()
            return
        if _loaded:
            return
        _loading = True
        try:
            from opcore.platforms import get_current_platform
            from opcore.plugins import load_general_plugins, strict_plugins

            platform = get_current_platform()
            for hook in ("import_kernels", "import_ir_kernels"):
                try:
                    getattr(platform, hook)()
                except Exception as exc:
                    message = (
                        f"platform {platform.name!r}: {hook}() failed: {type(exc).__name__}: "
                        f"{exc}; its providers are missing"
                    )
                    _errors.append(message)
                    if strict_plugins():
                        raise RuntimeError(
                            message + " [OPCORE_STRICT_PLUGINS=1 makes this fatal]"
                        ) from exc
                    logger.warning(message)
                    warnings.warn(message, KernelLoadWarning, stacklevel=3)
            load_general_plugins()
            _loaded = True
        finally:
            _loading = False
        for callback in _listeners:
            callback()


def kernel_load_errors() -> list[str]:
    """The failures of the platform's kernel hooks, one line each (a copy)."""
    return list(_errors)
