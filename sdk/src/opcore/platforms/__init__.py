"""Platforms: the declared `Platform` interface and the process's current platform.

``opcore.platforms.current_platform`` is resolved lazily, on first access, so a plugin can
``from opcore.platforms import Platform`` to subclass it without triggering resolution.
`get_current_platform()` is the same without attribute magic. `explain()` returns the
decision as data.
"""

from __future__ import annotations

import threading

from opcore.platforms.interface import (
    FORWARD_METHODS,
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
    resolve,
    resolving_plugin,
)

__all__ = [
    "FORWARD_METHODS",
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
]

_lock = threading.Lock()
_decision: Decision | None = None


def get_current_platform() -> Platform:
    """The platform of this process, resolved on first call (thread-safe, once)."""
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
    global _decision
    plugin = resolving_plugin()
    if plugin is not None:
        raise PlatformResolutionError(
            f"opcore plugin {plugin!r} accessed current_platform while it was itself being "
            f"probed or imported during platform resolution. Probes and plugin imports must "
            f"not query the current platform: move that access into a function that runs later."
        )
    with _lock:
        if _decision is None:
            _decision = resolve(first_caller_stack=format_stack())
        return _decision


def __getattr__(name: str):
    # PEP 562, for this one name only: resolution must wait until first use.
    if name == "current_platform":
        return get_current_platform()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
