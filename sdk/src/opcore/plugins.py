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

A plugin name belongs to one distribution. When two distributions declare the same name
(in one group, or one in each platform group), the first-party one keeps it (see
`FIRST_PARTY_DISTRIBUTIONS`), then the one in ``opcore.intree_platform_plugins``, then the
first found; every other claim is refused with an error naming both distributions
(`split_duplicates`). The same distribution seen twice on ``sys.path`` counts once.

Plugin code (imports, probes, general plugins) runs with its ``print`` output sent to
stderr (`opcore.plugin_output`), and a plugin that raises anything, ``SystemExit``
included, is recorded against its name; only ``KeyboardInterrupt`` passes through.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata as md
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterable

from opcore.env import env_flag, parse_plugin_names
from opcore.plugin_output import plugin_output_to_stderr

logger = logging.getLogger("opcore.plugins")

PLATFORM_PLUGINS_GROUP = "opcore.platform_plugins"
INTREE_PLATFORM_PLUGINS_GROUP = "opcore.intree_platform_plugins"
GENERAL_PLUGINS_GROUP = "opcore.general_plugins"
ALL_GROUPS = (PLATFORM_PLUGINS_GROUP, INTREE_PLATFORM_PLUGINS_GROUP, GENERAL_PLUGINS_GROUP)

# The plugin distributions this repository builds and releases with the core (plugins/*).
# "First-party" means exactly this: the installed distribution's name is one of these. It
# decides labels (a third-party distribution in the in-tree group is not shown as in-tree)
# and which distribution keeps a plugin name that two declare; it never changes how a
# platform behaves.
FIRST_PARTY_DISTRIBUTIONS = frozenset(
    {
        "opcore-plugin-cpu",
        "opcore-plugin-cuda",
        "opcore-plugin-rocm",
        "opcore-plugin-xpu",
        "opcore-plugin-tpu",
        "opcore-plugin-ascend",
        "opcore-plugin-vdev",
    }
)


def is_first_party(distribution: str | None) -> bool:
    """Whether ``distribution`` (an installed distribution's name) is one of opcore's own."""
    if not distribution:
        return False
    return distribution.lower().replace("_", "-").replace(".", "-") in FIRST_PARTY_DISTRIBUTIONS


class PluginWarning(UserWarning):
    """A plugin could not be loaded or probed; the others go on."""


class PluginError(RuntimeError):
    """A plugin failure made fatal by ``OPCORE_STRICT_PLUGINS=1`` or an explicit choice."""


def strict_plugins() -> bool:
    """``OPCORE_STRICT_PLUGINS`` as a switch; a bad value is an `opcore.config.ConfigError`."""
    return env_flag("OPCORE_STRICT_PLUGINS")


def plugin_allow_list() -> list[str] | None:
    """The names in ``OPCORE_PLUGINS``, or ``None`` when it is unset (load everything)."""
    raw = os.environ.get("OPCORE_PLUGINS")
    if raw is None:
        return None
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

    @property
    def first_party(self) -> bool:
        return is_first_party(self.distribution)

    def where(self) -> str:
        """``"distribution version"``, or the entry point's value without a distribution."""
        return f"{self.distribution} {self.version}" if self.distribution else self.value


def discover(group: str) -> list[DiscoveredPlugin]:
    """All entry points of ``group`` that pass ``OPCORE_PLUGINS``, sorted by name (and, for
    one name, in ``importlib.metadata`` order).

    The same distribution seen twice on ``sys.path`` is collapsed to the first. Two
    different distributions declaring one name are both returned: see `split_duplicates`.
    """
    allow = plugin_allow_list()
    seen: dict[tuple[str, str | None], DiscoveredPlugin] = {}
    for ep in md.entry_points(group=group):
        if allow is not None and ep.name not in allow:
            logger.debug("plugin %s (%s) skipped: not in OPCORE_PLUGINS", ep.name, group)
            continue
        dist = getattr(ep, "dist", None)
        distribution = dist.metadata["Name"] if dist is not None else None
        if (ep.name, distribution) in seen:
            continue
        seen[(ep.name, distribution)] = DiscoveredPlugin(
            name=ep.name,
            group=group,
            value=ep.value,
            distribution=distribution,
            version=dist.version if dist is not None else None,
            entry_point=ep,
        )
    # sorted() is stable: one name's distributions keep their discovery order.
    return sorted(seen.values(), key=lambda p: p.name)


def split_duplicates(
    plugins: Iterable[DiscoveredPlugin],
) -> tuple[list[DiscoveredPlugin], list[tuple[DiscoveredPlugin, PluginError]]]:
    """Give each plugin name to one distribution: ``(kept, refused)``.

    Of the plugins sharing a name, the first-party one keeps it, then the one in
    ``opcore.intree_platform_plugins``, then the first in ``plugins`` order. Each other one
    is returned in ``refused`` with the error that names both distributions. ``kept`` keeps
    the input order.
    """
    plugins = list(plugins)
    order = {id(p): i for i, p in enumerate(plugins)}

    def rank(p: DiscoveredPlugin) -> tuple[int, int, int]:
        return (not p.first_party, p.group != INTREE_PLATFORM_PLUGINS_GROUP, order[id(p)])

    owners: dict[str, DiscoveredPlugin] = {}
    for p in sorted(plugins, key=rank):
        owners.setdefault(p.name, p)
    kept, refused = [], []
    for p in plugins:
        owner = owners[p.name]
        if owner is p:
            kept.append(p)
            continue
        label = "first-party " if owner.first_party else ""
        refused.append(
            (
                p,
                PluginError(
                    f"the plugin name {p.name!r} belongs to {label}distribution "
                    f"{owner.where()} ({owner.group}); {p.where()} ({p.group}) declares the "
                    f"same name and is refused: plugin names are unique across tiers, so "
                    f"rename its entry point"
                ),
            )
        )
    return kept, refused


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


def describe_error(exc: BaseException) -> str:
    """``"ExceptionType: message"``, the form failures are recorded in."""
    return f"{type(exc).__name__}: {exc}"


def report_failure(plugin: DiscoveredPlugin, what: str, exc: BaseException) -> None:
    """Warn (or raise, under ``OPCORE_STRICT_PLUGINS=1``) about a plugin that failed."""
    message = (
        f"opcore plugin {plugin.name!r} ({plugin.group}, from {plugin.where()}) {what}: "
        f"{describe_error(exc)}"
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
# The general plugin this thread is running, so that re-entry is an error, not a deadlock
# on `_general_lock` (which the same thread already holds).
_general_running = threading.local()


def load_general_plugins() -> list[GeneralPluginResult]:
    """Run every ``opcore.general_plugins`` entry point once per process.

    A plugin that fails to import or raises (``SystemExit`` included) is recorded and warned
    about (fatal under ``OPCORE_STRICT_PLUGINS=1``); the others still run. A plugin that
    calls back into this function while it loads, for example by dispatching an op (the
    first dispatch loads the general plugins), gets a `PluginError` naming it. Its output
    to stdout goes to stderr. Later calls return the first call's results without running
    anything.
    """
    global _general_results
    results = _general_results
    if results is not None:
        return results
    refuse_reentry_from_general_plugin()
    with _general_lock:
        if _general_results is not None:
            return _general_results
        results = []
        kept, refused = split_duplicates(discover(GENERAL_PLUGINS_GROUP))
        for plugin, exc in refused:
            report_failure(plugin, "was refused", exc)
            results.append(_general_result(plugin, describe_error(exc)))
        for plugin in kept:
            results.append(_general_result(plugin, _run_general_plugin(plugin)))
        results.sort(key=lambda r: r.name)
        _general_results = results
        return results


def refuse_reentry_from_general_plugin() -> None:
    """Raise `PluginError` naming the general plugin this thread is loading, if any.

    Called on every path by which a general plugin's own code can come back into loading
    (this module, and the platform's kernel loading that runs the general plugins), so that
    re-entry is an error naming the plugin on each of them, never a hang or a half-loaded
    registry."""
    running: DiscoveredPlugin | None = getattr(_general_running, "plugin", None)
    if running is not None:
        raise PluginError(
            f"opcore general plugin {running.name!r} (from {running.where()}) re-entered "
            f"opcore.plugins.load_general_plugins() while it was being loaded, for example by "
            f"dispatching an op (the first dispatch loads the general plugins): a general "
            f"plugin must only register things; dispatch ops later, not while it loads"
        )


def _general_result(plugin: DiscoveredPlugin, error: str | None) -> GeneralPluginResult:
    return GeneralPluginResult(plugin.name, plugin.distribution, plugin.version, error)


def _run_general_plugin(plugin: DiscoveredPlugin) -> str | None:
    """Import and call one general plugin; its error as text, or ``None``."""
    _general_running.plugin = plugin
    try:
        with plugin_output_to_stderr():
            plugin.load()()
        logger.debug("general plugin %s ran", plugin.name)
        return None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a broken plugin never ends the process
        report_failure(plugin, "failed", exc)
        return describe_error(exc)
    finally:
        _general_running.plugin = None


def general_plugin_results() -> list[GeneralPluginResult] | None:
    """The results of `load_general_plugins`, or ``None`` if it has not run."""
    return _general_results
