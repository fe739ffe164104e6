"""Platform resolution: which plugin's platform this process runs on, and why.

The rules (docs/design.md#resolution-rules), applied by `resolve()`:

1. ``OPCORE_PLATFORM=<name>`` is authoritative: only that plugin is probed (``unspecified``
   selects `UnspecifiedPlatform`); a probe that says no or fails raises with its reason.
2. ``OPCORE_PLUGINS`` is an allow-list; names that match nothing are warned about.
3. Every probe is called exactly once, within a time budget (``OPCORE_PROBE_TIMEOUT_S``,
   default `DEFAULT_PROBE_TIMEOUT_S`; over one second is warned about). A probe that fails,
   raises (``SystemExit`` included) or runs over budget, an entry point that fails to load,
   and a platform class that fails to construct are recorded on their candidate and warned
   about (fatal with ``OPCORE_STRICT_PLUGINS=1``); the others go on. Probes are pure.
4. Two or more out-of-tree platforms activated: error. Exactly one: it wins over in-tree.
5. Otherwise two or more in-tree accelerators: error. Exactly one: it.
6. Otherwise the in-tree ``cpu`` fallback; with no plugin at all, `UnspecifiedPlatform`,
   with a warning.
7. A probe, plugin import or platform ``__init__`` that re-enters resolution is an error
   naming the plugin.
8. A platform class written for another plugin-API range (or declaring a malformed one) is
   refused, naming both versions.
9. A plugin name belongs to one distribution (`opcore.plugins.split_duplicates`): another
   distribution declaring it, in either platform group, is refused without running its
   code, naming both distributions.

The winner's class is constructed once; when that fails (not strict) the rules are applied
again without it, so `Decision.platform` is always the object ``current_platform`` returns
and the candidates say how it was chosen.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
import traceback
import warnings
from typing import Any

from opcore import PLUGIN_API_VERSION
from opcore import plugins as _plugins
from opcore.platforms.api_version import refusal_reason, removed_members_reason
from opcore.platforms.interface import Platform, UnspecifiedPlatform
from opcore.plugin_output import plugin_output_to_stderr

logger = logging.getLogger("opcore.platforms")

FALLBACK_PLUGIN = "cpu"
TIER_OUT_OF_TREE = "out-of-tree"
TIER_IN_TREE = "in-tree"
TIER_FALLBACK = "in-tree fallback"
# A distribution that is not first-party (`opcore.plugins.FIRST_PARTY_DISTRIBUTIONS`) but
# registers in the in-tree group: the in-tree rules (5, 6) apply to it, the label does not.
TIER_THIRD_PARTY = "third-party"

PROBE_TIMEOUT_ENV = "OPCORE_PROBE_TIMEOUT_S"
# Generous enough for a vendor runtime import on real hardware (a probe may import it), short
# enough that a wedged driver does not look like a hang.
DEFAULT_PROBE_TIMEOUT_S = 10.0
SLOW_PROBE_S = 1.0


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
    first_party: bool = False  # the distribution is one of opcore's own

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tier": self.tier,
            "distribution": self.distribution,
            "version": self.version,
            "first_party": self.first_party,
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


def parse_plugin_api(value: object) -> tuple[str, str]:
    """A class's ``plugin_api`` as ``(min, max)`` strings; `ValueError` when malformed."""
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(
            f"malformed plugin_api {value!r}: expected a (min, max) pair of 'MAJOR.MINOR' "
            f"strings, e.g. ('1.0', '2.0')"
        )
    low, high = (str(v) for v in value)
    for text in (low, high):
        try:
            _version_tuple(text)
        except ValueError as exc:
            raise ValueError(f"malformed plugin_api {value!r}: {exc}") from None
    return low, high


def api_compatible(plugin_api: tuple[str, str]) -> bool:
    """True when ``plugin_api[0] <= PLUGIN_API_VERSION < plugin_api[1]``."""
    low, high = plugin_api
    core = _version_tuple(PLUGIN_API_VERSION)
    return _version_tuple(low) <= core < _version_tuple(high)


# --------------------------------------------------------------------------- budget
def probe_timeout_s() -> float:
    """The probe budget in seconds: ``OPCORE_PROBE_TIMEOUT_S`` (unset or empty: the default).
    A value that is not a positive finite number raises `PlatformResolutionError`."""
    raw = os.environ.get(PROBE_TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_PROBE_TIMEOUT_S
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise PlatformResolutionError(
            f"{PROBE_TIMEOUT_ENV}={raw!r}: expected a positive number of seconds "
            f"(default {DEFAULT_PROBE_TIMEOUT_S:g})"
        )
    return value


# --------------------------------------------------------------------------- re-entrancy
_state = threading.local()


def resolving_plugin() -> str | None:
    """The plugin this thread is probing, importing or constructing right now, if any."""
    return getattr(_state, "plugin", None)


class _Guard:
    """Marks this thread as inside plugin ``name`` (probe, import or ``__init__``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.outer: str | None = None

    def __enter__(self) -> None:
        self.outer = resolving_plugin()
        _state.plugin = self.name

    def __exit__(self, *exc: object) -> None:
        _state.plugin = self.outer


# --------------------------------------------------------------------------- probing
def _tier(plugin: _plugins.DiscoveredPlugin) -> str:
    if plugin.group == _plugins.PLATFORM_PLUGINS_GROUP:
        return TIER_OUT_OF_TREE
    if not plugin.first_party:
        return TIER_THIRD_PARTY
    return TIER_FALLBACK if plugin.name == FALLBACK_PLUGIN else TIER_IN_TREE


def _role(plugin: _plugins.DiscoveredPlugin) -> str:
    """Which rule a candidate competes under: its group decides, not its label."""
    if plugin.group == _plugins.PLATFORM_PLUGINS_GROUP:
        return TIER_OUT_OF_TREE
    return TIER_FALLBACK if plugin.name == FALLBACK_PLUGIN else TIER_IN_TREE


def _candidate(plugin: _plugins.DiscoveredPlugin) -> Candidate:
    return Candidate(
        name=plugin.name,
        tier=_tier(plugin),
        distribution=plugin.distribution,
        version=plugin.version,
        entry_point=plugin.value,
        first_party=plugin.first_party,
    )


def _fail(
    plugin: _plugins.DiscoveredPlugin,
    cand: Candidate,
    what: str,
    exc: BaseException,
    *,
    authoritative: bool,
) -> None:
    """Record ``exc`` on ``cand``; then raise (explicit choice, or strict mode) or warn."""
    cand.activated = False
    cand.error = _plugins.describe_error(exc)
    if authoritative:
        raise PlatformResolutionError(
            f"OPCORE_PLATFORM={plugin.name}: plugin {plugin.name!r} "
            f"({cand.distribution} {cand.version}) {what}: {cand.error}",
            [cand],
        ) from exc
    _plugins.report_failure(plugin, what, exc)


@dataclasses.dataclass
class _ProbeRun:
    """What one plugin's probing did; filled in by the worker thread."""

    failure: str = "failed to load its entry point"  # what failed, if it fails now
    running: str = "loading its entry point"  # what runs now, if the budget ends now
    probed: bool = False
    result: object = None
    present: bool = False
    cls: object = None
    error: BaseException | None = None
    start: float = 0.0
    seconds: float = 0.0
    timed_out: bool = False
    started: threading.Event = dataclasses.field(default_factory=threading.Event)
    finished: threading.Event = dataclasses.field(default_factory=threading.Event)


def _run_probe(plugin: _plugins.DiscoveredPlugin, run: _ProbeRun) -> None:
    """The plugin's code, in the worker thread: load the entry point, probe, import the class."""
    with _Guard(plugin.name), plugin_output_to_stderr():
        try:
            probe = plugin.load()
            run.failure, run.running = "raised in its probe", "its probe"
            run.probed = True
            result = run.result = probe()
            run.present = bool(result)
            if run.present and isinstance(result, str):
                run.failure = f"could not import its platform class {result!r}"
                run.running = f"importing its platform class {result!r}"
                run.cls = _plugins.resolve_qualname(result)
        except BaseException as exc:  # SystemExit too: plugin code never ends the process
            run.error = exc


def _probe_in_order(
    jobs: list[tuple[_plugins.DiscoveredPlugin, _ProbeRun]], stop: threading.Event
) -> None:
    """The worker: each plugin's probing in turn, until done or told to stop."""
    for plugin, run in jobs:
        if stop.is_set():
            return
        run.start = time.perf_counter()
        run.started.set()
        _run_probe(plugin, run)
        run.seconds = time.perf_counter() - run.start
        run.finished.set()


def _finished_in_time(run: _ProbeRun, budget: float) -> bool:
    # The previous plugin has finished, so this one starts at once: both waits are bounded.
    if not run.started.wait(budget):
        return False
    return run.finished.wait(max(budget - (time.perf_counter() - run.start), 0.0))


def _probe_all(
    pairs: list[tuple[_plugins.DiscoveredPlugin, Candidate]],
    *,
    authoritative: bool,
    budget: float,
) -> dict[int, type[Platform]]:
    """Probe each plugin once, in order; fill its candidate. Returns the activated
    candidates' classes by ``id(candidate)``.

    The plugins' code runs in a daemon worker thread, so a probe that never returns costs
    ``budget`` seconds instead of forever (and cannot keep the process alive). One worker
    takes the plugins in turn without waiting for this thread in between (a thread per
    plugin would pay a wake-up of this thread per plugin, which a loaded machine makes
    slow); a plugin over budget is abandoned with its worker, and a new worker takes the
    plugins after it.
    """
    runs = [_ProbeRun() for _ in pairs]
    classes: dict[int, type[Platform]] = {}
    stop: threading.Event | None = None
    try:
        for index, ((plugin, cand), run) in enumerate(zip(pairs, runs, strict=True)):
            if stop is None:
                stop = threading.Event()
                jobs = [(p, r) for (p, _), r in zip(pairs[index:], runs[index:], strict=True)]
                threading.Thread(
                    target=_probe_in_order, args=(jobs, stop), name="opcore-probe", daemon=True
                ).start()
            if not _finished_in_time(run, budget):
                run.timed_out = True
                stop.set()  # the worker is stuck in this plugin: leave both behind
                stop = None
            cls = _conclude(plugin, cand, run, authoritative=authoritative, budget=budget)
            if cls is not None:
                classes[id(cand)] = cls
    finally:
        if stop is not None:
            stop.set()  # a fatal failure: probe no further
    return classes


def _conclude(
    plugin: _plugins.DiscoveredPlugin,
    cand: Candidate,
    run: _ProbeRun,
    *,
    authoritative: bool,
    budget: float,
) -> type[Platform] | None:
    """Fill ``cand`` from a finished (or timed-out) run and check the class; returns it
    when activated. Failures are recorded, warned about, or raised when authoritative or
    strict."""

    def fail(what: str, exc: BaseException) -> type[Platform] | None:
        _fail(plugin, cand, what, exc, authoritative=authoritative)
        return None  # recorded (or raised): no class is activated

    cand.probed = run.probed
    if run.timed_out:
        return fail(
            "did not answer in time",
            TimeoutError(
                f"{run.running} was still running after {PROBE_TIMEOUT_ENV}={budget:g} s "
                f"(abandoned; it keeps running in a background thread)"
            ),
        )
    elapsed = run.seconds
    if elapsed > SLOW_PROBE_S:
        warnings.warn(
            f"opcore plugin {plugin.name!r} ({plugin.group}, from {plugin.where()}): its "
            f"probe took {elapsed:.1f} s (entry point import, probe and class import); probes "
            f"should answer in well under a second, and over {PROBE_TIMEOUT_ENV}="
            f"{budget:g} s they fail",
            _plugins.PluginWarning,
            stacklevel=5,
        )
    if run.error is not None:
        return fail(run.failure, run.error)
    result = run.result
    if not run.present:
        if isinstance(result, Absent):
            cand.reason = result.reason
        else:
            cand.reason = "probe returned None" if result is None else f"probe returned {result!r}"
        return None
    if not isinstance(result, str):
        return fail(
            "returned a bad probe result",
            TypeError(f"expected a dotted class path or None, got {result!r}"),
        )
    cand.platform_class = result
    cls = run.cls
    if not (isinstance(cls, type) and issubclass(cls, Platform)):
        return fail(
            "named a class that is not a Platform",
            TypeError(f"{result} is {cls!r}, not a subclass of opcore.platforms.Platform"),
        )
    try:
        cand.plugin_api = parse_plugin_api(cls.plugin_api)
    except Exception as exc:  # anything a hostile class attribute raises
        return fail("declares a malformed plugin_api", exc)
    if not api_compatible(cand.plugin_api):
        distribution = cand.distribution or plugin.name
        return fail(
            "was refused", RuntimeError(refusal_reason(result, cand.plugin_api, distribution))
        )
    # A class still defining a member an API version removed was written for the older API,
    # whatever range it declares (1.x classes inherited theirs): its kernels would not run.
    removed = removed_members_reason(result, cls)
    if removed is not None:
        return fail("was refused", RuntimeError(removed))
    cand.activated = True
    return cls


def _instantiate(
    plugin: _plugins.DiscoveredPlugin,
    cand: Candidate,
    cls: type[Platform],
    *,
    authoritative: bool,
) -> Platform | None:
    """Construct the winner's platform (in this thread: its ``__init__`` may set up
    per-thread state). ``None``, with the failure recorded on ``cand``, when that fails."""
    try:
        with _Guard(cand.name), plugin_output_to_stderr():
            platform = cls()
            name = platform.name
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: plugin code never ends the process
        _fail(plugin, cand, "failed to construct its platform", exc, authoritative=authoritative)
        return None
    if name != cand.name:
        # The entry-point name is the platform's identity; keep them equal so logs,
        # configs and `opcore info` all speak of one name.
        mismatch = ValueError(
            f"platform class {cand.platform_class} declares name={name!r}, but its "
            f"entry point is named {cand.name!r}: they must be equal"
        )
        _fail(plugin, cand, "was refused", mismatch, authoritative=authoritative)
        return None
    return platform


def environment_snapshot() -> dict[str, str | None]:
    """The ``OPCORE_*`` variables resolution reads, as set now (unset: ``None``)."""
    keys = ("OPCORE_PLATFORM", "OPCORE_PLUGINS", "OPCORE_STRICT_PLUGINS", PROBE_TIMEOUT_ENV)
    return {k: os.environ.get(k) for k in keys}


HOW_TO_CHOOSE = (
    "choose one with OPCORE_PLATFORM=<name>, or restrict the candidates with "
    "OPCORE_PLUGINS=<name,...>"
)


def _choose(
    entries: list[tuple[_plugins.DiscoveredPlugin, Candidate]],
) -> tuple[_plugins.DiscoveredPlugin, Candidate, str, str, list[str]] | None:
    """Rules 4-6 over the activated candidates: ``(plugin, candidate, rule, reason,
    overridden)``, ``None`` when nothing activated; raises on an ambiguity."""
    cands = [c for _, c in entries]

    def activated(role: str) -> list[tuple[_plugins.DiscoveredPlugin, Candidate]]:
        return [(p, c) for p, c in entries if c.activated and _role(p) == role]

    oot = activated(TIER_OUT_OF_TREE)
    intree = activated(TIER_IN_TREE)
    fallback = activated(TIER_FALLBACK)
    if len(oot) > 1:
        names = ", ".join(c.name for _, c in oot)
        raise PlatformResolutionError(
            f"{len(oot)} out-of-tree platform plugins activated ({names}); {HOW_TO_CHOOSE}",
            cands,
        )
    if oot:
        overridden = [c.name for _, c in intree + fallback]
        plugin, winner = oot[0]
        reason = f"the one activated out-of-tree platform {winner.name!r} wins over in-tree"
        if overridden:
            reason += f" ({', '.join(overridden)} overridden)"
        return plugin, winner, "4", reason, overridden
    if len(intree) > 1:
        names = ", ".join(c.name for _, c in intree)
        raise PlatformResolutionError(
            f"{len(intree)} in-tree accelerator platforms activated ({names}); {HOW_TO_CHOOSE}",
            cands,
        )
    if intree:
        plugin, winner = intree[0]
        reason = f"the one activated in-tree accelerator {winner.name!r}"
        return plugin, winner, "5", reason, [c.name for _, c in fallback]
    if fallback:
        plugin, winner = fallback[0]
        reason = "no accelerator platform activated: the in-tree cpu fallback"
        return plugin, winner, "6", reason, []
    return None


def _refuse(plugin: _plugins.DiscoveredPlugin, exc: _plugins.PluginError) -> Candidate:
    """The candidate of a plugin refused for its name; warned about (fatal when strict)."""
    cand = _candidate(plugin)
    cand.error = _plugins.describe_error(exc)
    _plugins.report_failure(plugin, "was refused", exc)
    return cand


def resolve(first_caller_stack: str = "") -> Decision:
    """Apply the resolution rules once and return the decision. Not cached: see
    `opcore.platforms.get_current_platform` for the per-process singleton."""
    start = time.perf_counter()
    env = environment_snapshot()
    budget = probe_timeout_s()  # checked before any plugin code runs

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
        return _resolve_explicit(chosen, decide, budget)

    unmatched = _plugins.warn_unmatched_allow_list()
    discovered = _plugins.discover(_plugins.PLATFORM_PLUGINS_GROUP) + _plugins.discover(
        _plugins.INTREE_PLATFORM_PLUGINS_GROUP
    )
    _, refused = _plugins.split_duplicates(discovered)
    refusals = {id(p): exc for p, exc in refused}
    entries = [
        (p, _refuse(p, refusals[id(p)]) if id(p) in refusals else _candidate(p)) for p in discovered
    ]
    to_probe = [(p, c) for p, c in entries if id(p) not in refusals]
    classes = _probe_all(to_probe, authoritative=False, budget=budget)
    cands = [c for _, c in entries]

    # A winner whose class fails to construct is dropped (its candidate carries the error)
    # and the rules run again: each round deactivates one candidate, so this ends.
    while (choice := _choose(entries)) is not None:
        plugin, winner, rule, reason, overridden = choice
        platform = _instantiate(plugin, winner, classes[id(winner)], authoritative=False)
        if platform is None:
            continue
        if rule == "4" and overridden:
            logger.info("platform %s overrides in-tree %s", winner.name, ", ".join(overridden))
        return decide(platform, rule, reason, cands, overridden, unmatched)

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


def _resolve_explicit(chosen: str, decide, budget: float) -> Decision:
    if chosen == UnspecifiedPlatform.name:
        return decide(UnspecifiedPlatform(), "1", "OPCORE_PLATFORM=unspecified", [])
    # The explicit choice is authoritative: the allow-list does not hide it.
    saved = os.environ.pop("OPCORE_PLUGINS", None)
    try:
        discovered = _plugins.discover(_plugins.PLATFORM_PLUGINS_GROUP) + _plugins.discover(
            _plugins.INTREE_PLATFORM_PLUGINS_GROUP
        )
    finally:
        if saved is not None:
            os.environ["OPCORE_PLUGINS"] = saved
    named = [p for p in discovered if p.name == chosen]
    if not named:
        installed = sorted({p.name for p in discovered})
        raise PlatformResolutionError(
            f"OPCORE_PLATFORM={chosen}: no installed platform plugin is named {chosen!r} "
            f"(installed: {', '.join(installed) or 'none'}; or 'unspecified')"
        )
    # Of two distributions that declare the name, the explicit choice gets its owner.
    (found,), refused = _plugins.split_duplicates(named)
    others = [_refuse(plugin, exc) for plugin, exc in refused]
    cand = _candidate(found)
    cls = _probe_all([(found, cand)], authoritative=True, budget=budget).get(id(cand))
    if cls is None:
        raise PlatformResolutionError(
            f"OPCORE_PLATFORM={chosen}: the probe of plugin {chosen!r} "
            f"({cand.distribution} {cand.version}) found no device: {cand.reason}",
            [cand],
        )
    platform = _instantiate(found, cand, cls, authoritative=True)
    assert platform is not None  # authoritative: a failure raised
    reason = f"OPCORE_PLATFORM={chosen} (only that plugin was probed)"
    return decide(platform, "1", reason, [cand, *others])


def format_stack() -> str:
    return "".join(traceback.format_stack()[:-2])
