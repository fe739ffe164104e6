"""Platform resolution: which plugin's platform this process runs on, and why.

The rules (DESIGN §2), applied by `resolve()`:

1. ``OPCORE_PLATFORM=<name>`` is authoritative: only that plugin is probed (``unspecified``
   selects `UnspecifiedPlatform`); a probe that says no or fails raises with its reason.
2. ``OPCORE_PLUGINS`` is an allow-list; names that match nothing are warned about.
3. Every probe is called exactly once. A failing probe or entry point is recorded and warned
   about (fatal with ``OPCORE_STRICT_PLUGINS=1``). Probes are pure.
4. Two or more out-of-tree platforms activated: error. Exactly one: it wins over in-tree.
5. Otherwise two or more in-tree accelerators: error. Exactly one: it.
6. Otherwise the in-tree ``cpu`` fallback; with no plugin at all, `UnspecifiedPlatform`,
   with a warning.
7. A probe or plugin import that re-enters resolution is an error naming the plugin.
8. A platform class written for another plugin-API range is refused, naming both versions.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import traceback
import warnings
from typing import Any

from opcore import PLUGIN_API_VERSION
from opcore import plugins as _plugins
from opcore.platforms.interface import Platform, UnspecifiedPlatform

logger = logging.getLogger("opcore.platforms")

FALLBACK_PLUGIN = "cpu"
TIER_OUT_OF_TREE = "out-of-tree"
TIER_IN_TREE = "in-tree"
TIER_FALLBACK = "in-tree fallback"


class PlatformResolutionError(RuntimeError):
    """The platform could not be chosen; the message says why and how to choose.
    ``candidates`` holds what resolution saw before it stopped and ``environment`` the
    variables it read (for `opcore info`)."""

    def __init__(self, message: str, candidates: list[Candidate] | None = None) -> None:
        super().__init__(message)
        self.candidates = list(candidates or [])
        # The variables resolution read, as `Decision.environment` has them.
        self.environment = environment_snapshot()


class Absent:
    """What a probe returns when its hardware is not there, with the reason.

    ``return Absent("torch_npu failed to import: ...")`` keeps the reason for
    `opcore.platforms.explain()`. It is falsy, so a plain ``None`` check also works.
    """

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = str(reason)

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Absent({self.reason!r})"


@dataclasses.dataclass
class Candidate:
    """One platform plugin as seen by resolution."""

    name: str
    tier: str
    distribution: str | None
    version: str | None
    entry_point: str
    probed: bool = False
    activated: bool = False
    platform_class: str | None = None
    reason: str | None = None  # why it is not activated, when the probe said no
    error: str | None = None  # the exception, when loading, probing or checking failed
    plugin_api: tuple[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tier": self.tier,
            "distribution": self.distribution,
            "version": self.version,
            "entry_point": self.entry_point,
            "probed": self.probed,
            "activated": self.activated,
            "platform_class": self.platform_class,
            "reason": self.reason,
            "error": self.error,
            "plugin_api": list(self.plugin_api) if self.plugin_api else None,
        }


@dataclasses.dataclass
class Decision:
    """The whole platform decision, as data (`opcore.platforms.explain()`)."""

    platform: Platform
    rule: str
    reason: str
    candidates: list[Candidate]
    overridden: list[str]
    unmatched_allow_list: list[str]
    environment: dict[str, str | None]
    first_caller_stack: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        p = self.platform
        return {
            "platform": {
                "name": p.name,
                "class": f"{type(p).__module__}.{type(p).__qualname__}",
                "device_type": p.device_type,
                "device_name": p.device_name,
                "dispatch_key": p.dispatch_key,
                "dist_backend": p.dist_backend,
                "plugin_api": list(p.plugin_api),
            },
            "rule": self.rule,
            "reason": self.reason,
            "plugin_api_version": PLUGIN_API_VERSION,
            "candidates": [c.to_dict() for c in self.candidates],
            "overridden": list(self.overridden),
            "unmatched_allow_list": list(self.unmatched_allow_list),
            "environment": dict(self.environment),
            "resolution_ms": round(self.seconds * 1e3, 3),
        }


# --------------------------------------------------------------------------- versioning
def _version_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(text).split("."))
    except ValueError:
        raise ValueError(f"plugin API version {text!r} is not of the form 'MAJOR.MINOR'") from None


def api_compatible(plugin_api: tuple[str, str]) -> bool:
    """True when ``plugin_api[0] <= PLUGIN_API_VERSION < plugin_api[1]``."""
    low, high = plugin_api
    core = _version_tuple(PLUGIN_API_VERSION)
    return _version_tuple(low) <= core < _version_tuple(high)


# --------------------------------------------------------------------------- re-entrancy
_state = threading.local()


def resolving_plugin() -> str | None:
    """The plugin this thread is probing or importing right now, if any."""
    return getattr(_state, "plugin", None)


class _Guard:
    """Marks this thread as inside plugin ``name`` (probe or import)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        _state.plugin = self.name

    def __exit__(self, *exc: object) -> None:
        _state.plugin = None


# --------------------------------------------------------------------------- probing
def _tier(group: str, name: str) -> str:
    if group == _plugins.PLATFORM_PLUGINS_GROUP:
        return TIER_OUT_OF_TREE
    return TIER_FALLBACK if name == FALLBACK_PLUGIN else TIER_IN_TREE


def _candidate(plugin: _plugins.DiscoveredPlugin) -> Candidate:
    return Candidate(
        name=plugin.name,
        tier=_tier(plugin.group, plugin.name),
        distribution=plugin.distribution,
        version=plugin.version,
        entry_point=plugin.value,
    )


def _probe(plugin: _plugins.DiscoveredPlugin, cand: Candidate, *, authoritative: bool) -> None:
    """Load the entry point, call its probe once, import and check the platform class.
    Fills ``cand``; failures are recorded, warned about, or raised when authoritative."""

    def fail(what: str, exc: BaseException) -> None:
        cand.activated = False
        cand.error = f"{type(exc).__name__}: {exc}"
        if authoritative:
            raise PlatformResolutionError(
                f"OPCORE_PLATFORM={plugin.name}: plugin {plugin.name!r} "
                f"({cand.distribution} {cand.version}) {what}: {cand.error}",
                [cand],
            ) from exc
        _plugins.report_failure(plugin, what, exc)

    with _Guard(plugin.name):
        try:
            probe = plugin.load()
        except Exception as exc:
            return fail("failed to load its entry point", exc)
        try:
            cand.probed = True
            result = probe()
        except Exception as exc:
            return fail("raised in its probe", exc)
        if not result:
            cand.reason = result.reason if isinstance(result, Absent) else "probe returned None"
            return
        if not isinstance(result, str):
            return fail(
                "returned a bad probe result",
                TypeError(f"expected a dotted class path or None, got {result!r}"),
            )
        cand.platform_class = result
        try:
            cls = _plugins.resolve_qualname(result)
        except Exception as exc:
            return fail(f"could not import its platform class {result!r}", exc)
    if not (isinstance(cls, type) and issubclass(cls, Platform)):
        return fail(
            "named a class that is not a Platform",
            TypeError(f"{result} is {cls!r}, not a subclass of opcore.platforms.Platform"),
        )
    cand.plugin_api = tuple(cls.plugin_api)
    try:
        compatible = api_compatible(cand.plugin_api)
    except ValueError as exc:
        return fail("declares a malformed plugin_api", exc)
    if not compatible:
        low, high = cand.plugin_api
        return fail(
            "was refused",
            RuntimeError(
                f"{result} was written for opcore plugin API >={low},<{high}, but this opcore "
                f"provides plugin API {PLUGIN_API_VERSION}; install a version of "
                f"{cand.distribution or plugin.name} built for plugin API {PLUGIN_API_VERSION}"
            ),
        )
    cand.activated = True
    _classes[plugin.name] = cls


_classes: dict[str, type[Platform]] = {}


def _instantiate(cand: Candidate) -> Platform:
    cls = _classes[cand.name]
    platform = cls()
    if platform.name != cand.name:
        # The entry-point name is the platform's identity; keep them equal so logs,
        # configs and `opcore info` all speak of one name.
        raise PlatformResolutionError(
            f"platform class {cand.platform_class} declares name={platform.name!r}, but its "
            f"entry point is named {cand.name!r}: they must be equal"
        )
    return platform


def environment_snapshot() -> dict[str, str | None]:
    """The ``OPCORE_*`` variables resolution reads, as set now (unset: ``None``)."""
    keys = ("OPCORE_PLATFORM", "OPCORE_PLUGINS", "OPCORE_STRICT_PLUGINS")
    return {k: os.environ.get(k) for k in keys}


def resolve(first_caller_stack: str = "") -> Decision:
    """Apply the resolution rules once and return the decision. Not cached: see
    `opcore.platforms.get_current_platform` for the per-process singleton."""
    start = time.perf_counter()
    env = environment_snapshot()
    _classes.clear()

    def decide(platform: Platform, rule: str, reason: str, cands, overridden=(), unmatched=()):
        return Decision(
            platform=platform,
            rule=rule,
            reason=reason,
            candidates=list(cands),
            overridden=list(overridden),
            unmatched_allow_list=list(unmatched),
            environment=env,
            first_caller_stack=first_caller_stack,
            seconds=time.perf_counter() - start,
        )

    chosen = (env["OPCORE_PLATFORM"] or "").strip()
    if chosen:
        return _resolve_explicit(chosen, decide)

    unmatched = _plugins.warn_unmatched_allow_list()
    discovered = _plugins.discover(_plugins.PLATFORM_PLUGINS_GROUP) + _plugins.discover(
        _plugins.INTREE_PLATFORM_PLUGINS_GROUP
    )
    cands = []
    for plugin in discovered:
        cand = _candidate(plugin)
        _probe(plugin, cand, authoritative=False)
        cands.append(cand)

    oot = [c for c in cands if c.activated and c.tier == TIER_OUT_OF_TREE]
    intree = [c for c in cands if c.activated and c.tier == TIER_IN_TREE]
    fallback = [c for c in cands if c.activated and c.tier == TIER_FALLBACK]
    how_to_choose = (
        "choose one with OPCORE_PLATFORM=<name>, or restrict the candidates with "
        "OPCORE_PLUGINS=<name,...>"
    )
    if len(oot) > 1:
        names = ", ".join(c.name for c in oot)
        raise PlatformResolutionError(
            f"{len(oot)} out-of-tree platform plugins activated ({names}); {how_to_choose}",
            cands,
        )
    if oot:
        overridden = [c.name for c in intree + fallback]
        winner = oot[0]
        reason = f"the one activated out-of-tree platform {winner.name!r} wins over in-tree"
        if overridden:
            reason += f" ({', '.join(overridden)} overridden)"
            logger.info("platform %s overrides in-tree %s", winner.name, ", ".join(overridden))
        return decide(_instantiate(winner), "4", reason, cands, overridden, unmatched)
    if len(intree) > 1:
        names = ", ".join(c.name for c in intree)
        raise PlatformResolutionError(
            f"{len(intree)} in-tree accelerator platforms activated ({names}); {how_to_choose}",
            cands,
        )
    if intree:
        winner = intree[0]
        overridden = [c.name for c in fallback]
        reason = f"the one activated in-tree accelerator {winner.name!r}"
        return decide(_instantiate(winner), "5", reason, cands, overridden, unmatched)
    if fallback:
        reason = "no accelerator platform activated: the in-tree cpu fallback"
        return decide(_instantiate(fallback[0]), "6", reason, cands, (), unmatched)
    allow = _plugins.plugin_allow_list()
    installed = _plugins.installed_names(
        (_plugins.PLATFORM_PLUGINS_GROUP, _plugins.INTREE_PLATFORM_PLUGINS_GROUP)
    )
    if not installed:
        why = "no opcore platform plugin is installed"
    elif not cands and allow is not None:
        why = (
            f"OPCORE_PLUGINS={','.join(allow)} matches no installed platform plugin "
            f"(installed: {', '.join(installed)})"
        )
    else:
        why = (
            "no installed platform plugin activated ("
            + "; ".join(f"{c.name}: {c.error or c.reason}" for c in cands)
            + ")"
        )
    message = f"{why}: running on UnspecifiedPlatform (native kernels through plain torch)"
    if not installed:
        message += "; install opcore-plugin-cpu or a platform plugin"
    warnings.warn(message, _plugins.PluginWarning, stacklevel=4)
    return decide(UnspecifiedPlatform(), "6", message, cands, (), unmatched)


def _resolve_explicit(chosen: str, decide) -> Decision:
    if chosen == UnspecifiedPlatform.name:
        return decide(UnspecifiedPlatform(), "1", "OPCORE_PLATFORM=unspecified", [])
    found = None
    installed = []
    # The explicit choice is authoritative: the allow-list does not hide it.
    saved = os.environ.pop("OPCORE_PLUGINS", None)
    try:
        for group in (_plugins.PLATFORM_PLUGINS_GROUP, _plugins.INTREE_PLATFORM_PLUGINS_GROUP):
            for plugin in _plugins.discover(group):
                installed.append(plugin.name)
                if plugin.name == chosen and found is None:
                    found = plugin
    finally:
        if saved is not None:
            os.environ["OPCORE_PLUGINS"] = saved
    if found is None:
        raise PlatformResolutionError(
            f"OPCORE_PLATFORM={chosen}: no installed platform plugin is named {chosen!r} "
            f"(installed: {', '.join(sorted(installed)) or 'none'}; or 'unspecified')"
        )
    cand = _candidate(found)
    _probe(found, cand, authoritative=True)
    if not cand.activated:
        raise PlatformResolutionError(
            f"OPCORE_PLATFORM={chosen}: the probe of plugin {chosen!r} "
            f"({cand.distribution} {cand.version}) found no device: {cand.reason}",
            [cand],
        )
    reason = f"OPCORE_PLATFORM={chosen} (only that plugin was probed)"
    return decide(_instantiate(cand), "1", reason, [cand])


def format_stack() -> str:
    return "".join(traceback.format_stack()[:-2])
