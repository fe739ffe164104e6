"""`opcore info`: what is active here and why.

Human output by default; ``--json`` prints the stable schema documented in
docs/cli-info.md (``schema_version`` changes only when a field is removed or changes
meaning; new fields may be added). Every field is present on every run, failures included,
so a tool never has to guess which keys exist.

Exit status: 0 when everything was reported; 1 when the platform could not be resolved or a
plugin failed under ``OPCORE_STRICT_PLUGINS=1``; 2 when an ``OPCORE_*`` variable or an option
is invalid. A failure is one line on stderr (``opcore info: error: ...``) and the ``error``
field; it is never a traceback.
"""

from __future__ import annotations

import argparse
import json
import platform as _pyplatform
import sys
import time
import warnings
from typing import Any

from opcore.settings import add_config_arguments

SCHEMA_VERSION = 1

EXIT_OK = 0
EXIT_NOT_RESOLVED = 1  # resolution failed, or a plugin failed under strict mode
EXIT_INVALID_CONFIG = 2  # a malformed or unknown value in an OPCORE_* variable or option

# `error_kind` values and their exit status.
ERROR_RESOLUTION = "resolution"
ERROR_PLUGIN = "plugin"
ERROR_CONFIG = "config"
EXIT_STATUS = {
    None: EXIT_OK,
    ERROR_RESOLUTION: EXIT_NOT_RESOLVED,
    ERROR_PLUGIN: EXIT_NOT_RESOLVED,
    ERROR_CONFIG: EXIT_INVALID_CONFIG,
}

# The sections collected once the platform is resolved; null until then.
SECTIONS = (
    "devices",
    "general_plugins",
    "config",
    "ops",
    "layers",
    "attention",
    "compile",
    "certificates",
    "tuning",
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "info",
        help="show the platform decision, plugins, ops, layers and attention backends",
        description="Show which platform is active and why, every candidate plugin, the "
        "providers each op would use, layer bindings and attention candidates. Exit status: "
        "0 reported (also when a required provider property leaves ops without a "
        "provider: they are listed, and calling one raises), 1 platform not resolved (or a "
        "plugin failed under strict mode), 2 invalid OPCORE_* variable or option.",
    )
    parser.add_argument("--json", action="store_true", help="print the stable JSON schema")
    # No platform options here: `info` must also report a resolution that failed.
    add_config_arguments(parser, platform_options=False)
    parser.set_defaults(run=run)


def _skeleton() -> dict[str, Any]:
    """Every top-level field, with the values of a run that got nowhere."""
    import torch

    import opcore
    from opcore.platforms.resolution import environment_snapshot

    return {
        "schema_version": SCHEMA_VERSION,
        "opcore_version": opcore.__version__,
        "plugin_api_version": opcore.PLUGIN_API_VERSION,
        "python": _pyplatform.python_version(),
        "torch_version": torch.__version__,
        "platform": None,
        "rule": None,
        "reason": None,
        "error": None,
        "error_kind": None,
        "candidates": [],
        "overridden": [],
        "unmatched_allow_list": [],
        "environment": environment_snapshot(),
        "resolution_ms": None,
        **dict.fromkeys(SECTIONS),
    }


def _fail(data: dict[str, Any], kind: str, exc: BaseException | str) -> dict[str, Any]:
    data["error"], data["error_kind"] = str(exc), kind
    return data


def _unmatched_allow_list() -> list[str]:
    """The ``OPCORE_PLUGINS`` names no installed plugin has (already warned about by
    resolution, so not again); none when ``OPCORE_PLATFORM`` bypassed the allow-list."""
    from opcore import plugins
    from opcore.platforms.resolution import environment_snapshot

    if (environment_snapshot().get("OPCORE_PLATFORM") or "").strip():
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plugins.warn_unmatched_allow_list()


def collect(args: argparse.Namespace | None = None) -> dict[str, Any]:
    """Everything `opcore info` shows, as plain data. Raises nothing for a bad environment,
    a failed resolution or a strict-mode plugin failure: ``error`` and ``error_kind`` say
    what stopped it, and every field is present (null or empty when not reached)."""
    from opcore import platforms, plugins
    from opcore.config import ConfigError
    from opcore.settings import check_environment

    data = _skeleton()
    try:
        check_environment()  # before resolution reads any of them
    except ConfigError as exc:
        return _fail(data, ERROR_CONFIG, exc)
    start = time.perf_counter()
    try:
        decision = platforms.explain()
    except (platforms.PlatformResolutionError, plugins.PluginError, ConfigError) as exc:
        data["resolution_ms"] = round((time.perf_counter() - start) * 1e3, 3)
        data["candidates"] = [c.to_dict() for c in getattr(exc, "candidates", [])]
        data["environment"] = getattr(exc, "environment", None) or data["environment"]
        data["unmatched_allow_list"] = _unmatched_allow_list()
        kind = (
            ERROR_CONFIG
            if isinstance(exc, ConfigError)
            else ERROR_PLUGIN
            if isinstance(exc, plugins.PluginError)
            else ERROR_RESOLUTION
        )
        return _fail(data, kind, exc)
    data.update(decision.to_dict())
    return _collect_platform(data, decision, args)


def _collect_platform(data: dict[str, Any], decision: Any, args: Any) -> dict[str, Any]:
    from opcore import plugins
    from opcore.config import ConfigError
    from opcore.platforms.device_check import device_type_problem
    from opcore.settings import config_from_args, get_current_config, set_current_config

    platform = decision.platform
    problem = device_type_problem(platform)  # torch lacks the device type: say whose and why
    try:
        data["devices"] = {"error": problem} if problem else platform.device_summary()
    except Exception as exc:  # a device query failing must not hide the decision
        data["devices"] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        data["general_plugins"] = [vars(g) for g in plugins.load_general_plugins()]
    except plugins.PluginError as exc:  # strict mode: a failing general plugin is fatal
        return _fail(data, ERROR_PLUGIN, exc)
    try:
        # The registries the config's names are checked against: loaded first, so a bad
        # name is refused here, as a config error, not later in a section.
        import opcore.attention
        import opcore.layers  # noqa: F401

        config = config_from_args(args, platform) if args is not None else get_current_config()
    except ConfigError as exc:
        return _fail(data, ERROR_CONFIG, exc)
    tuning_error: Exception | None = None
    with set_current_config(config):
        for section, fn in _sections():
            try:
                data[section] = fn()
            except Exception as exc:
                data[section] = {"error": f"{type(exc).__name__}: {exc}"}
                if section == "tuning" and _is_tuning_table_error(exc):
                    tuning_error = exc
        data.update(extra_sections())
    # An op whose priority cannot be decided is a configuration error (its user list names
    # a provider nobody registered): every call of it would raise. An op that no provider
    # of the required properties serves is not (ir.info's "missing_properties"): the
    # config is valid and the other ops run; it is reported per op and its calls raise.
    op_errors = [
        op["error"] for op in ((data["ops"] or {}).get("ops") or {}).values() if op.get("error")
    ]
    if op_errors:
        return _fail(data, ERROR_CONFIG, op_errors[0])
    if tuning_error is not None:
        # OPCORE_TUNING names a missing file, a directory or an invalid table: every op
        # call would raise it, so it is a bad variable (the message names it), exit 2.
        return _fail(data, ERROR_CONFIG, tuning_error)
    return data


def _is_tuning_table_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the tuning table named by ``OPCORE_TUNING`` failing to load (a
    table found by the search never raises: its faults are warnings)."""
    from opcore.tuning import TuningTableError

    return isinstance(exc, TuningTableError)


def _sections():
    """The subsystem sections: each a name and a zero-argument function returning data."""
    from opcore import attention, certificates, ir, layers, tuning
    from opcore import compile as opcore_compile
    from opcore.settings import get_current_config

    yield "config", lambda: get_current_config().to_dict()
    yield "ops", lambda: ir.info(get_current_config())
    yield "layers", layers.binding_info
    yield "attention", lambda: {**attention.selection_info(), "probe": attention.probe_selection()}
    yield "compile", opcore_compile.info
    # Per provider in use: whether a shipped conformance certificate covers it here.
    yield "certificates", lambda: certificates.info(config=get_current_config())
    # The tuning tables in use and what they cover (docs/tuning.md).
    yield "tuning", tuning.info


# Sections other distributions add (docs/design.md's entry-point groups): each entry point's
# name is the section's key, its value a zero-argument function returning JSON-able data, or
# None for "no section here" (e.g. the engine it reports on does not import).
INFO_SECTIONS_GROUP = "opcore.info_sections"


def extra_sections() -> dict[str, Any]:
    """The ``opcore.info_sections`` entry points' data by name, sorted; a name the core
    already uses is skipped, and a section that fails is ``{"error": ...}``."""
    import importlib.metadata as md

    reserved = set(_skeleton_keys())
    out: dict[str, Any] = {}
    for ep in sorted(md.entry_points(group=INFO_SECTIONS_GROUP), key=lambda e: e.name):
        if ep.name in reserved or ep.name in out:
            continue
        try:
            value = ep.load()()
        except Exception as exc:
            value = {"error": f"{type(exc).__name__}: {exc}"}
        if value is not None:
            out[ep.name] = value
    return out


def _skeleton_keys() -> tuple[str, ...]:
    """The core's own top-level fields (an extra section never takes one)."""
    return tuple(_skeleton())


def run(args: argparse.Namespace) -> int:
    data = collect(args)
    if args.json:
        json.dump(data, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(data))
    if data["error"]:
        sys.stdout.flush()
        print(f"opcore info: error: {_one_line(data['error'])}", file=sys.stderr)
    return EXIT_STATUS[data["error_kind"]]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# --------------------------------------------------------------------------- rendering
def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]


def _candidate_result(c: dict[str, Any]) -> str:
    if c["error"]:
        return f"error: {c['error']}"
    if c["activated"]:
        return f"activated -> {c['platform_class']}"
    if not c["probed"]:
        return "not probed"
    return f"absent: {c['reason']}"


def render(data: dict[str, Any]) -> str:
    out = [
        f"opcore {data['opcore_version']} (plugin API {data['plugin_api_version']}), "
        f"torch {data['torch_version']}, Python {data['python']}",
        "",
    ]
    p = data["platform"]
    if p is None:
        what = "INVALID CONFIGURATION" if data.get("error_kind") == ERROR_CONFIG else "NOT RESOLVED"
        out += [f"Platform: {what}: {data['error'] or 'unknown'}", ""]
    else:
        out += [
            f"Platform: {p['name']}  ({p['class']})",
            f"  device_type={p['device_type']}  dispatch_key={p['dispatch_key']}  "
            f"dist_backend={p['dist_backend']}",
            f"  chosen by rule {data['rule']}: {data['reason']}",
            "",
        ]
    out.append("Candidates:")
    rows = [["NAME", "TIER", "DISTRIBUTION", "RESULT"]]
    for c in data["candidates"]:
        dist = f"{c['distribution']} {c['version']}" if c["distribution"] else c["entry_point"]
        rows.append([c["name"], c["tier"], dist, _candidate_result(c)])
    if len(rows) > 1:
        out += _table(rows)
    else:
        out.append("  (none seen)" if p is None else "  (no platform plugin installed)")
    for name in data.get("unmatched_allow_list") or []:
        out.append(f"  warning: OPCORE_PLUGINS names {name!r}, which no installed plugin has")
    out.append("")
    if p is None:
        return "\n".join(out) + "\n"
    devices = data.get("devices") or {}
    out.append("Devices:")
    if "error" in devices:
        out.append(f"  error: {devices['error']}")
    for d in devices.get("devices", []):
        mem = d["total_memory_bytes"] / 2**30
        cap = f", capability {d['capability']}" if d.get("capability") else ""
        out.append(f"  [{d['index']}] {d['name']}, {mem:.1f} GiB{cap}")
    extra = {k: v for k, v in devices.items() if k not in ("count", "devices", "error")}
    for key, value in extra.items():
        out.append(f"  {key}: {value}")
    out.append("")
    general = data.get("general_plugins")
    if general is None:  # a general plugin failed under strict mode
        return "\n".join([*out, f"General plugins: FAILED: {data['error']}", ""]) + "\n"
    out.append("General plugins:" + ("" if general else " none"))
    for g in general:
        status = f"error: {g['error']}" if g["error"] else "ran"
        out.append(f"  {g['name']} ({g['distribution']} {g['version']}): {status}")
    out.append("")
    if data.get("config") is None:  # the config could not be created
        return "\n".join([*out, f"Configuration: INVALID: {data['error']}", ""]) + "\n"
    out += _render_ops(data.get("ops"))
    out += _render_layers(data.get("layers"))
    out += _render_attention(data.get("attention"))
    out += _render_compile(data.get("compile"))
    out += _render_certificates(data.get("certificates"))
    out += _render_tuning(data.get("tuning"))
    others = [k for k in data if k not in _skeleton_keys()]
    if others:
        out.append("Sections from other distributions (opcore info --json has them in full):")
        out += [f"  {k}: {_one_line(json.dumps(data[k], default=str))[:200]}" for k in others]
        out.append("")
    return "\n".join(out) + "\n"


def _error_section(title: str, data: Any) -> list[str] | None:
    if data is None:
        return []
    if isinstance(data, dict) and "error" in data and len(data) == 1:
        return [f"{title}:", f"  error: {data['error']}", ""]
    return None


def _render_ops(data: Any) -> list[str]:
    early = _error_section("Ops", data)
    if early is not None:
        return early
    rows = [["OP", "EFFECTIVE PRIORITY", "PROVIDERS [PROPERTIES]", "NOT USABLE HERE"]]
    errors = []
    missing = []
    required: list[str] = []
    for name, op in sorted(data["ops"].items()):
        required = op.get("required_properties") or required
        providers = ", ".join(_with_properties(p) for p in op["providers"])
        unusable = [p["name"] for p in op["providers"] if not p["supported"]]
        skipped = [f"{k}: {v}" for k, v in (op.get("skipped") or {}).items()]
        if op.get("error"):  # its priority could not be decided: no list to show
            errors.append(f"  {name}: error: {op['error']}")
            priority = "ERROR (below)"
        elif op.get("missing_properties"):  # valid config; a call of this op raises
            missing.append(f"  {name}: {op['missing_properties']}")
            priority = "NONE WITH REQUIRED PROPERTIES (below)"
        else:
            priority = " > ".join(op["effective_priority"])
        rows.append([name, priority, providers, "; ".join(unusable + skipped)])
    legend = (
        "properties (docs/properties.md): B batch_invariant, D deterministic, C capture_safe"
        + (f"; the config requires: {', '.join(required)}" if required else "")
    )
    return [
        "Ops (providers tried in order; native always accepts):",
        *_table(rows),
        f"  {legend}",
        *errors,
        *(
            [
                f"  {len(missing)} op(s) have no provider with the required properties; "
                "calling one raises MissingPropertyError (docs/properties.md):",
                *missing,
            ]
            if missing
            else []
        ),
        "",
    ]


_PROPERTY_CODES = {"batch_invariant": "B", "deterministic": "D", "capture_safe": "C"}


def _with_properties(provider: dict[str, Any]) -> str:
    codes = "".join(_PROPERTY_CODES.get(p, "?") for p in provider.get("properties") or ())
    return f"{provider['name']} [{codes or '-'}]"


def _render_layers(data: Any) -> list[str]:
    early = _error_section("Layers", data)
    if early is not None:
        return early
    # ROUTE: how a kernel reaches the layer (forward_native -> ops by priority, or a
    # register_oot whole-layer replacement), as `opcore.layers.describe_route` words it.
    rows = [["OP NAME", "LAYER CLASS", "ROUTE", "WHY"]]
    for name, entry in sorted(data.get("registry", {}).items()):
        cls = entry["replacement"] or entry["class"]
        if entry["replacement"]:
            cls += f" (replaces {entry['class']})"
        route = entry.get("route") or entry.get("bound", "")
        rows.append([name, cls, route, entry.get("why", "")])
    # Instances constructed in this process are in the JSON (`layers.bindings`).
    return ["Layers:", *_table(rows), ""]


def _render_attention(data: Any) -> list[str]:
    early = _error_section("Attention", data)
    if early is not None:
        return early
    out = ["Attention:"]
    registered = [n for n, e in data.get("registry", {}).items() if e.get("class_path")]
    out.append(f"  registered backends: {', '.join(registered)}")
    selections = list(data.get("selections") or [])
    if data.get("probe"):
        selections.append(data["probe"])
    for sel in selections:
        cfg = sel.get("config", {})
        what = ", ".join(f"{k}={v}" for k, v in cfg.items() if v is not None)
        if sel.get("error"):
            out.append(f"  for {what}: NO VALID BACKEND: {sel['error']}")
        else:
            out.append(f"  for {what}: {sel['selected']} (from {sel['source']})")
        for cand in sel.get("candidates", []):
            verdict = "valid" if cand["valid"] else "rejected: " + "; ".join(cand["reasons"])
            out.append(f"    candidate {cand['name']}: {verdict}")
    return out + [""]


def _render_compile(data: Any) -> list[str]:
    early = _error_section("Compile", data)
    if early is not None:
        return early
    out = ["Compile (opcore.compile):", f"  pipeline: {' > '.join(data['pipeline'])}"]
    rows = [["OP", *(f"PRIORITY ({mode})" for mode in data["modes"])]]
    ops = sorted(next(iter(data["modes"].values()))["priorities"]) if data["modes"] else []
    for op in ops:
        rows.append([op, *(" > ".join(m["priorities"][op]) for m in data["modes"].values())])
    out += _table(rows)
    return out + [""]


def _render_certificates(data: Any) -> list[str]:
    early = _error_section("Certificates", data)
    if early is not None:
        return early
    out = [f"Certificates (providers in use, device type {data['device_type']}):"]
    rows = [["OP", "PROVIDER", "IDENTITY", "STATUS"]]
    for op, providers in sorted(data["ops"].items()):
        for provider, cov in providers.items():
            status = (
                f"certified ({', '.join(cov['modes'])})"
                if cov["modes"]
                else f"not certified: {cov['why']}"
            )
            rows.append([op, provider, cov["identity"], status])
    out += _table(rows)
    out += [f"  warning: {e}" for e in data.get("errors") or []]
    return out + [""]


def _render_tuning(data: Any) -> list[str]:
    early = _error_section("Tuning", data)
    if early is not None:
        return early
    used = data["used"]
    out = [f"Tuning (OPCORE_TUNING: {data['setting']}; identity {data['identity']}):"]
    out.append(f"  in use: {', '.join(used) if used else 'none (providers use their heuristics)'}")
    searched = [s for s in data["searched"] if s not in used]
    if searched:
        out.append(f"  also found: {', '.join(searched)}")
    rows = [["OP", "DTYPES", "SHAPES", "TUNED BUCKETS"]]
    for op, cov in data["coverage"].items():
        rows.append([op, ", ".join(cov["dtypes"]), " ".join(cov["shapes"]), str(cov["buckets"])])
    if len(rows) > 1:
        out += _table(rows)
    if data["other_devices"]:
        out.append(f"  for other devices (not used here): {len(data['other_devices'])}")
    excluded = data.get("excluded_by_required_properties", [])
    if excluded:
        out.append(f"  left out for the required properties (not stale): {len(excluded)}")
    if data["stale"]:
        out.append(f"  ignored (stale or invalid): {len(data['stale'])}")
        out += [f"    {s}" for s in data["stale"][:10]]
    return out + [""]
