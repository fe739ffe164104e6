"""Platforms: the declared `Platform` interface and the process's current platform.

``opcore.platforms.current_platform`` is resolved lazily, on first access, so a plugin can
``from opcore.platforms import Platform`` to subclass it without triggering resolution.
`get_current_platform()` is the same without attribute magic. `explain()` returns the
decision as data.

Resolution runs once per process. When it fails, the failure is kept: every later access
raises the same error again (same type, message and candidates) without running a probe.

``current_platform`` (module attribute):
    The `Platform` instance of this process: the installed platform plugin whose probe
    won (see `explain()` for why), or `UnspecifiedPlatform` when none applies. Reading it
    resolves the platform on first access; it is the object `get_current_platform()`
    returns.

    Raises:
        PlatformResolutionError: resolution failed (every access raises it again), or
            a platform plugin read it while being probed, imported or constructed.

    Examples:
        >>> import opcore.platforms
        >>> from opcore.platforms import Platform, current_platform
        >>> isinstance(current_platform, Platform)
        True
        >>> current_platform is opcore.platforms.get_current_platform()
        True
"""

from __future__ import annotations

import copy
import threading

from opcore.platforms.interface import (
    Platform,
    UnspecifiedPlatform,
    declared_members,
)
from opcore.platforms.resolution import (
    Absent,
    Candidate,
    Decision,
    PlatformResolutionError,
    format_stack,
    probe_timeout_s,
    resolve,
    resolving_plugin,
)

__all__ = [
    "Absent",
    "Candidate",
    "Decision",
    "Platform",
    "PlatformResolutionError",
    "UnspecifiedPlatform",
    "declared_members",
    "explain",
    "get_current_platform",
    "is_resolved",
    "probe_timeout_s",
]

_lock = threading.Lock()
_decision: Decision | None = None
_failure: Exception | None = None  # why resolution failed, once it has


def get_current_platform() -> Platform:
    """The platform of this process, resolved on first call (thread-safe, once).

    Returns:
        The `Platform` instance that ``opcore.platforms.current_platform`` also gives.

    Raises:
        PlatformResolutionError: resolution failed (kept: every later call raises it
            again without probing), or a platform plugin called this while being
            probed, imported or constructed.

    Examples:
        >>> from opcore.platforms import Platform, get_current_platform
        >>> platform = get_current_platform()
        >>> isinstance(platform, Platform), platform is get_current_platform()
        (True, True)
    """
    decision = _decision
    if decision is None:
        decision = _resolve_once()
    return decision.platform


def is_resolved() -> bool:
    """Whether this process has already resolved its platform (without resolving it)."""
    return _decision is not None


def explain() -> Decision:
    """The platform decision: every candidate, its distribution and version, tier, probe
    result or error, and the rule that chose the winner. Resolves if needed."""
    return _decision if _decision is not None else _resolve_once()


def _resolve_once() -> Decision:
    global _decision, _failure
    plugin = resolving_plugin()
    if plugin is not None:
        raise PlatformResolutionError(
            f"opcore plugin {plugin!r} accessed current_platform while it was itself being "
            f"probed, imported or constructed during platform resolution. Probes, plugin "
            f"imports and platform __init__ must not query the current platform: move that "
            f"access into a function that runs later."
        )
    with _lock:
        if _decision is None and _failure is None:
            try:
                _decision = resolve(first_caller_stack=format_stack())
            except Exception as exc:  # not KeyboardInterrupt: an interrupted one may retry
                _failure = exc
                raise
        if _failure is not None:
            raise _again(_failure)
        assert _decision is not None  # resolved above; a failure was raised instead
        return _decision


def _again(exc: Exception) -> Exception:
    """A fresh copy of the kept failure to raise (raising the one object again and again
    would grow its traceback with every access)."""
    try:
        again = copy.copy(exc)  # same type, message and attributes (``candidates``)
    except Exception:
        return exc
    again.__cause__ = exc.__cause__
    again.__suppress_context__ = exc.__suppress_context__
    return again


def __getattr__(name: str):
    # PEP 562, for this one name only: resolution must wait until first use.
    if name == "current_platform":
        return get_current_platform()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
