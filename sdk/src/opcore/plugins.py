"""Plugin discovery through `importlib.metadata` entry points.

Three groups:

- ``opcore.platform_plugins``: out-of-tree platforms. Value: a zero-argument probe that
  returns the platform class's dotted path, or ``None`` when its hardware is absent.
- ``opcore.intree_platform_plugins``: the first-party platforms (cpu, cuda, rocm, xpu, tpu),
  with the same probe contract.
- ``opcore.general_plugins``: zero-argument functions with side effects (extra ops,
  providers, layer overrides). Run once per process by `load_general_plugins`; they must be
  idempotent because every process (and every worker) runs them.

``OPCORE_PLUGINS=a,b`` is an allow-list over all three groups: only entry points with those
names are loaded. A listed name that no installed plugin has is warned about.
``OPCORE_STRICT_PLUGINS=1`` turns a plugin that fails to load (or whose probe raises) from a
warning into an error.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata as md
import logging
import os
import threading
import warnings
from collections.abc import Callable

logger = logging.getLogger("opcore.plugins")

PLATFORM_PLUGINS_GROUP = "opcore.platform_plugins"
INTREE_PLATFORM_PLUGINS_GROUP = "opcore.intree_platform_plugins"
GENERAL_PLUGINS_GROUP = "opcore.general_plugins"
ALL_GROUPS = (PLATFORM_PLUGINS_GROUP, INTREE_PLATFORM_PLUGINS_GROUP, GENERAL_PLUGINS_GROUP)


class PluginWarning(UserWarning):
    """A plugin could not be loaded or probed; the others go on."""


class PluginError(RuntimeError):
    """A plugin failure made fatal by ``OPCORE_STRICT_PLUGINS=1`` or an explicit choice."""


def strict_plugins() -> bool:
    """``OPCORE_STRICT_PLUGINS`` as a switch; a bad value is an `opcore.config.ConfigError`."""
    from opcore.config import env_flag

    return env_flag("OPCORE_STRICT_PLUGINS")


def plugin_allow_list() -> list[str] | None:
    """The names in ``OPCORE_PLUGINS``, or ``None`` when it is unset (load everything)."""
    raw = os.environ.get("OPCORE_PLUGINS")
    if raw is None:
        return None
    from opcore.config import parse_plugin_names

    return parse_plugin_names(raw)


@dataclasses.dataclass
class DiscoveredPlugin:
    """One entry point of one group, before or after loading."""

    name: str
    group: str
    value: str
    distribution: str | None
    version: str | None
    entry_point: md.EntryPoint | None = dataclasses.field(default=None, repr=False)

    def load(self) -> Callable[[], object]:
        assert self.entry_point is not None
        return self.entry_point.load()


def discover(group: str) -> list[DiscoveredPlugin]:
    """All entry points of ``group`` that pass ``OPCORE_PLUGINS``, sorted by name.

    Duplicate names (the same distribution seen twice on ``sys.path``) are collapsed to
    the first, as ``importlib.metadata`` orders them.
    """
    allow = plugin_allow_list()
    seen: dict[str, DiscoveredPlugin] = {}
    for ep in md.entry_points(group=group):
        if allow is not None and ep.name not in allow:
            logger.debug("plugin %s (%s) skipped: not in OPCORE_PLUGINS", ep.name, group)
            continue
        if ep.name in seen:
            continue
        dist = getattr(ep, "dist", None)
        seen[ep.name] = DiscoveredPlugin(
            name=ep.name,
            group=group,
            value=ep.value,
            distribution=dist.metadata["Name"] if dist is not None else None,
            version=dist.version if dist is not None else None,
            entry_point=ep,
        )
    return [seen[k] for k in sorted(seen)]


def installed_names(groups: tuple[str, ...] = ALL_GROUPS) -> list[str]:
    """The names of every installed entry point of ``groups``, sorted, whatever
    ``OPCORE_PLUGINS`` lets through."""
    return sorted({ep.name for group in groups for ep in md.entry_points(group=group)})


def warn_unmatched_allow_list() -> list[str]:
    """Warn about each ``OPCORE_PLUGINS`` name that no installed plugin of any group has;
    return those names."""
    allow = plugin_allow_list()
    if allow is None:
        return []
    installed = {ep.name for group in ALL_GROUPS for ep in md.entry_points(group=group)}
    missing = [n for n in allow if n not in installed and n != "unspecified"]
    for name in missing:
        warnings.warn(
            f"OPCORE_PLUGINS names {name!r}, but no installed opcore plugin has that name "
            f"(installed: {', '.join(sorted(installed)) or 'none'})",
            PluginWarning,
            stacklevel=3,
        )
    return missing


def report_failure(plugin: DiscoveredPlugin, what: str, exc: BaseException) -> None:
    """Warn (or raise, under ``OPCORE_STRICT_PLUGINS=1``) about a plugin that failed."""
    where = f"{plugin.distribution} {plugin.version}" if plugin.distribution else plugin.value
    message = (
        f"opcore plugin {plugin.name!r} ({plugin.group}, from {where}) {what}: "
        f"{type(exc).__name__}: {exc}"
    )
    if strict_plugins():
        raise PluginError(message + " [OPCORE_STRICT_PLUGINS=1 makes this fatal]") from exc
    # One warning (not also a log record: both would print). `logging.captureWarnings`
    # routes it into an application's logs.
    warnings.warn(message, PluginWarning, stacklevel=3)


def resolve_qualname(qualname: str) -> object:
    """Import ``"pkg.module.Name"`` and return ``Name``."""
    module_name, _, attr = qualname.rpartition(".")
    if not module_name:
        raise ValueError(f"{qualname!r} is not a dotted path 'package.module.Name'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None


@dataclasses.dataclass
class GeneralPluginResult:
    name: str
    distribution: str | None
    version: str | None
    error: str | None


_general_lock = threading.Lock()
_general_results: list[GeneralPluginResult] | None = None


def load_general_plugins() -> list[GeneralPluginResult]:
    """Run every ``opcore.general_plugins`` entry point once per process.

    A plugin that fails to import or raises is recorded and warned about (fatal under
    ``OPCORE_STRICT_PLUGINS=1``); the others still run. Later calls return the first
    call's results without running anything.
    """
    global _general_results
    with _general_lock:
        if _general_results is not None:
            return _general_results
        results = []
        for plugin in discover(GENERAL_PLUGINS_GROUP):
            error = None
            try:
                func = plugin.load()
                func()
                logger.debug("general plugin %s ran", plugin.name)
            except Exception as exc:  # a broken plugin never takes the others down
                error = f"{type(exc).__name__}: {exc}"
                report_failure(plugin, "failed", exc)
            results.append(
                GeneralPluginResult(plugin.name, plugin.distribution, plugin.version, error)
            )
        _general_results = results
        return results


def general_plugin_results() -> list[GeneralPluginResult] | None:
    """The results of `load_general_plugins`, or ``None`` if it has not run."""
    return _general_results
