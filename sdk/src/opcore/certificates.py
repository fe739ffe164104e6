"""Conformance certificates: reading them, and saying which providers they cover.

A certificate is the ``certificate.json`` every ``opcore conformance`` run writes next to
its reports (the format and the rules below are documented in docs/conformance.md,
"Certificates"). A plugin ships the ones it stands behind inside its import package, in a
``certificates/`` folder (``<package>/certificates/*.json``, found with
`importlib.resources`, so it works from a wheel as well as from a source tree).

`parse` is strict: a field of the wrong type or with a value outside its set (``mode``
not ``quick`` or ``full``, ``passed`` not a boolean, ``format_version`` not the integer
1, an unknown status in ``counts``...) makes the whole file unusable, a `CertificateError`
naming the file and the field.

A provider is *certified* on this device kind in a mode when some certificate found here

- is shipped by the installed distribution that registers the provider (the one that
  installed the source file its identity hashes): a package certifies only its own
  distribution's providers;
- was written on a platform of the same ``device_type``, in that ``mode``;
- lists the provider once, under the same op with the same identity hash
  (`opcore.ir.identity`: a hash of its source, so any edit to the provider's module
  changes it), with ``passed`` true and ``counts`` that agree with it (a case passed,
  none failed, errored or passed unexpectedly);
- is of a run that could certify: not stopped early, complete or a selection made with
  filters, a selection with no red case, and totals (``counts``) that account for every
  case its providers' counts list;

and no certificate that meets the first two conditions records failures for the same
identity. Otherwise it is "not certified", with the reason. The core only reads this
format: the conformance suite writes it (the core imports no conformance code).
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.metadata as metadata
import inspect
import json
import os
import re
import sys
from collections.abc import Iterable
from importlib import resources
from typing import Any

FORMAT = "opcore-conformance-certificate"
FORMAT_VERSION = 1
FOLDER = "certificates"
MODES = ("quick", "full")
# The conformance suite's status vocabulary (opcore_conformance.status), repeated so the
# core imports no conformance code; test_conformance_certificate checks they agree.
STATUSES = ("pass", "fail", "xfail", "xpass", "skip", "unsupported", "not_applicable", "error")
RED = ("fail", "error", "xpass")

CERTIFIED = "certified"
NOT_CERTIFIED = "not certified"

# The fields a certificate must have for `coverage` to use it.
_REQUIRED = (
    "format",
    "format_version",
    "device_type",
    "mode",
    "complete",
    "filters",
    "counts",
    "providers",
)
_IDENTITY = re.compile(r"^[0-9a-f]{64}$")


class CertificateError(ValueError):
    """A certificate that cannot be used; the message is one line naming the file and the
    field."""


@dataclasses.dataclass(frozen=True)
class Certificate:
    """One parsed certificate.

    ``providers``: ``{(op, provider): entry}`` (the first entry of each pair; an entry has
    ``identity``, ``passed`` and ``counts``); ``data``: the whole document;
    ``distribution``: the installed distribution shipping the file (a normalized name;
    ``None`` when not known, and then it certifies nothing); ``problems``: per listed pair
    whose entry certifies nothing, why (listed twice, ``passed`` contradicting its
    ``counts``); ``void``: why the whole certificate certifies nothing, or ``None``.
    """

    source: str
    device_type: str
    mode: str
    providers: dict[tuple[str, str], dict[str, Any]]
    data: dict[str, Any]
    distribution: str | None = None
    problems: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    void: str | None = None


def normalize(name: str) -> str:
    """A distribution name in its normalized form (PEP 503: ``Opcore_Foo`` -> ``opcore-foo``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {json.dumps(value)}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {json.dumps(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _bad(source: str, field: str, expected: str, value: Any) -> CertificateError:
    return CertificateError(
        f"{source}: field {field}: expected {expected}, got {_json_type(value)}"
    )


def _text(source: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(source, field, "a non-empty string", value)
    return value


def _counts(source: str, field: str, value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise _bad(source, field, "an object of counts per status", value)
    for status, n in value.items():
        if status not in STATUSES:
            raise CertificateError(
                f"{source}: field {field}: unknown status {status!r} "
                f"(the statuses are {', '.join(STATUSES)})"
            )
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise _bad(source, f"{field}.{status}", "a count (an integer >= 0)", n)
    return value


def _describe_counts(counts: dict[str, int], statuses: Iterable[str] = STATUSES) -> str:
    shown = [f"{s} {counts[s]}" for s in statuses if counts.get(s)]
    return ", ".join(shown) if shown else "none"


def _holds(counts: dict[str, int]) -> bool:
    """What ``passed`` must say for these counts: a case passed and none was red."""
    return counts.get("pass", 0) > 0 and not any(counts.get(s) for s in RED)


def parse(data: Any, source: str, *, distribution: str | None = None) -> Certificate:
    """Check ``data`` (a decoded certificate) and return it as a `Certificate`.

    ``distribution``: the installed distribution shipping it (`shipped` finds it); a
    certificate without one certifies nothing.

    Raises:
        CertificateError: a missing field, a field of the wrong type or with a value
            outside its set; the message names the file and the field.
    """
    if not isinstance(data, dict):
        raise CertificateError(f"{source}: not a JSON object")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise CertificateError(f"{source}: missing field(s) {', '.join(missing)}")
    if data["format"] != FORMAT or not isinstance(data["format"], str):
        raise _bad(source, "format", json.dumps(FORMAT), data["format"])
    version = data["format_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise _bad(source, "format_version", f"the integer {FORMAT_VERSION}", version)
    if version != FORMAT_VERSION:
        raise CertificateError(
            f"{source}: field format_version: {version!r} is not "
            f"{FORMAT_VERSION} (written by another opcore version)"
        )
    device_type = _text(source, "device_type", data["device_type"])
    mode = data["mode"]
    if not isinstance(mode, str) or mode not in MODES:
        raise _bad(source, "mode", " or ".join(json.dumps(m) for m in MODES), mode)
    complete = data["complete"]
    if not isinstance(complete, bool):
        raise _bad(source, "complete", "true or false", complete)
    filters = data["filters"]
    if not isinstance(filters, dict):
        raise _bad(source, "filters", "an object", filters)
    totals = _counts(source, "counts", data["counts"])
    # Written by suites since this field was added; certificates written before lack it.
    stopped = data.get("stopped")
    if stopped is not None:
        _text(source, "stopped", stopped)
    if not isinstance(data["providers"], list):
        raise _bad(source, "providers", "a list", data["providers"])

    providers: dict[tuple[str, str], dict[str, Any]] = {}
    positions: dict[tuple[str, str], list[int]] = {}
    problems: dict[tuple[str, str], str] = {}
    listed: dict[str, int] = {}
    for i, entry in enumerate(data["providers"]):
        where = f"providers[{i}]"
        if not isinstance(entry, dict):
            raise _bad(source, where, "an object", entry)
        for k in ("op", "provider", "identity", "passed", "counts"):
            if k not in entry:
                raise CertificateError(f"{source}: field {where}: missing {k}")
        op = _text(source, f"{where}.op", entry["op"])
        provider = _text(source, f"{where}.provider", entry["provider"])
        identity = entry["identity"]
        if not isinstance(identity, str) or not _IDENTITY.match(identity):
            raise _bad(source, f"{where}.identity", "64 lowercase hex digits", identity)
        passed = entry["passed"]
        if not isinstance(passed, bool):
            raise _bad(source, f"{where}.passed", "true or false", passed)
        counts = _counts(source, f"{where}.counts", entry["counts"])
        if entry.get("distribution") is not None:
            _text(source, f"{where}.distribution", entry["distribution"])
        for status, n in counts.items():
            listed[status] = listed.get(status, 0) + n
        key = (op, provider)
        positions.setdefault(key, []).append(i)
        if key in providers:
            continue
        providers[key] = entry
        if passed != _holds(counts):
            problems[key] = (
                f"contradicts itself for it: passed is {json.dumps(passed)} but its counts "
                f"are {_describe_counts(counts)}"
            )
    for key, at in positions.items():
        if len(at) > 1:
            problems[key] = (
                f"lists {key[0]}/{key[1]} {len(at)} times (providers"
                f"{', '.join(f'[{i}]' for i in at)}): a duplicate certifies nothing"
            )

    void = None
    selection = any(filters.values())
    over = [s for s in STATUSES if listed.get(s, 0) > totals.get(s, 0)]
    if stopped is not None:
        void = f"the run stopped early ({stopped})"
    elif complete and selection:
        void = "it contradicts itself: complete is true but filters are set"
    elif not complete and not selection:
        void = "the run stopped before every case ran (complete is false, no filter was set)"
    elif not complete and any(totals.get(s) for s in RED):
        void = (
            f"the run is a selection (complete is false) with red cases "
            f"(counts: {_describe_counts(totals, RED)})"
        )
    elif over:
        void = (
            "it contradicts itself: its providers' counts exceed the run's counts ("
            + ", ".join(f"{s} {listed[s]} > {totals.get(s, 0)}" for s in over)
            + ")"
        )
    return Certificate(
        source,
        device_type,
        mode,
        providers,
        data,
        normalize(distribution) if distribution else None,
        problems,
        void,
    )


def load_text(text: str, source: str, *, distribution: str | None = None) -> Certificate:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CertificateError(f"{source}: not valid JSON: {exc}") from None
    return parse(data, source, distribution=distribution)


# ----------------------------------------------------------------- who installed what
class Installed:
    """Which installed distribution a file belongs to, for the top-level packages ``tops``.

    A file listed in a distribution's ``RECORD`` belongs to that distribution, whatever
    package folder it lies in. A file no distribution lists (a source tree on
    ``sys.path``, an editable install) belongs to the one distribution that provides its
    top-level package; with none, or several, it belongs to none (`owner` says why)."""

    def __init__(self, tops: Iterable[str]):
        wanted = set(tops)
        self.tops: dict[str, set[str]] = {}
        self.files: dict[str, set[str]] = {}
        for dist in metadata.distributions():
            declared = [t for t in (dist.read_text("top_level.txt") or "").split() if t in wanted]
            listed = _listed(dist, wanted)
            if not (declared or listed):
                continue
            name = dist.metadata["Name"]
            if not name:
                continue
            name = normalize(name)
            for top in declared:
                self.tops.setdefault(top, set()).add(name)
            for top, path in listed:
                self.tops.setdefault(top, set()).add(name)
                located = os.path.normpath(os.path.abspath(str(dist.locate_file(path))))
                self.files.setdefault(located, set()).add(name)

    def owner(self, path: str | None, top: str) -> tuple[str | None, str]:
        """``(distribution, "")``, or ``(None, why)`` when no single one owns the file."""
        if path:
            listing = sorted(self.files.get(os.path.normpath(os.path.abspath(path)), ()))
            if len(listing) == 1:
                return listing[0], ""
            if listing:
                return None, f"{path} is listed by several distributions ({', '.join(listing)})"
        providing = sorted(self.tops.get(top, ()))
        if len(providing) == 1:
            return providing[0], ""
        if not providing:
            return None, f"no installed distribution provides the package {top!r}"
        return None, (
            f"the package {top!r} is provided by several distributions "
            f"({', '.join(providing)}) and none of them lists the file"
        )


def _listed(dist: metadata.Distribution, wanted: set[str]) -> list[tuple[str, str]]:
    """``(top-level name, path)`` of each file ``dist`` lists under a package in ``wanted``.
    A ``RECORD`` is filtered line by line before it is parsed (all of them together list
    tens of thousands of files); a distribution without one lists what ``files`` gives."""
    text = dist.read_text("RECORD")
    if text is None:
        paths = [str(p) for p in dist.files or ()]
    else:
        lines = [ln for ln in text.splitlines() if _first(ln.lstrip('"')) in wanted]
        paths = [row[0] for row in csv.reader(lines) if row]
    return [(_first(p), p) for p in paths if _first(p) in wanted]


def _first(path: str) -> str:
    """The top-level package or module a listed path (or ``RECORD`` line) lies in."""
    head = re.split(r"[/,\\]", path, maxsplit=1)[0]
    return head.removesuffix(".py")


def _top_package(module: str | None) -> str | None:
    return module.split(".")[0] if module else None


def _provider_file(impl: Any) -> tuple[str | None, str | None]:
    """The source file a provider's identity hashes, and its top-level package."""
    fn = impl.impl_fn
    top = _top_package(getattr(fn, "__module__", None))
    try:
        path = inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:
        path = None
    if path is None and top is not None:
        module = sys.modules.get(fn.__module__)
        path = getattr(module, "__file__", None)
    return path, top


def provider_distribution(impl: Any, installed: Installed | None = None) -> tuple[str | None, str]:
    """The installed distribution registering provider ``impl`` (an `opcore.ir.Impl`):
    the one that installed the source file its identity hashes. ``(name, "")``, or
    ``(None, why)``."""
    path, top = _provider_file(impl)
    if top is None:
        return None, "its function names no module"
    installed = installed if installed is not None else Installed([top])
    return installed.owner(path, top)


# ----------------------------------------------------------------- finding and judging
def shipped(
    package: str, installed: Installed | None = None
) -> tuple[list[Certificate], list[str]]:
    """The certificates in ``<package>/certificates/*.json`` and, one line each, the files
    there that cannot be used: unreadable or malformed ones, those whose shipping
    distribution cannot be told, those that certify nothing. A package without the folder
    ships none."""
    try:
        folder = resources.files(package).joinpath(FOLDER)
    except (ModuleNotFoundError, TypeError, ValueError):
        return [], []
    if not folder.is_dir():
        return [], []
    top = package.split(".")[0]
    installed = installed if installed is not None else Installed([top])
    found, errors = [], []
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not (item.name.endswith(".json") and item.is_file()):
            continue
        source = f"{package}/{FOLDER}/{item.name}"
        path = os.fspath(item) if isinstance(item, os.PathLike) else None
        distribution, why = installed.owner(path, top)
        try:
            cert = load_text(item.read_text(encoding="utf-8"), source, distribution=distribution)
        except (CertificateError, OSError, UnicodeDecodeError) as exc:
            errors.append(str(exc) if isinstance(exc, CertificateError) else f"{source}: {exc}")
            continue
        found.append(cert)
        if distribution is None:
            errors.append(f"{source}: certifies nothing: no distribution ships it ({why})")
        elif cert.void:
            errors.append(f"{source}: certifies nothing: {cert.void}")
    return found, errors


def _distribution_name(value: str) -> str:
    """``name@version`` (as a certificate's providers entry records it) -> normalized name."""
    return normalize(value.rsplit("@", 1)[0])


def coverage(
    op: str,
    provider: str,
    identity: str,
    device_type: str,
    certificates: list[Certificate],
    *,
    distribution: str | None,
    distribution_unknown: str = "",
) -> dict[str, Any]:
    """Whether ``certificates`` cover this provider on ``device_type``: ``status``
    (`CERTIFIED` or `NOT_CERTIFIED`), ``modes`` (those covered), ``sources`` (the covering
    files) and ``why`` (for "not certified": the misses, in words). ``distribution``: the
    installed distribution registering the provider (`provider_distribution`), ``None``
    when unknown (then nothing certifies it; ``distribution_unknown`` says why)."""
    own = normalize(distribution) if distribution else None
    modes: set[str] = set()
    sources: list[str] = []
    misses: list[str] = []
    failures: list[str] = []
    for cert in certificates:
        entry = cert.providers.get((op, provider))
        if entry is None:
            continue
        if cert.distribution is None:
            misses.append(f"{cert.source}: cannot tell which distribution ships it")
        elif own is None:
            misses.append(
                f"{cert.source}: cannot tell which distribution registers the provider"
                + (f" ({distribution_unknown})" if distribution_unknown else "")
            )
        elif cert.distribution != own:
            misses.append(
                f"{cert.source} is shipped by {cert.distribution}, the provider is "
                f"registered by {own} (a package certifies only its own distribution's "
                f"providers)"
            )
        elif cert.void:
            misses.append(f"{cert.source} certifies nothing: {cert.void}")
        elif (op, provider) in cert.problems:
            misses.append(f"{cert.source} {cert.problems[(op, provider)]}")
        elif entry.get("distribution") and _distribution_name(entry["distribution"]) != own:
            misses.append(
                f"{cert.source} lists it as a provider of {entry['distribution']}, the "
                f"provider is registered by {own}"
            )
        elif cert.device_type != device_type:
            misses.append(f"{cert.source} is for device type {cert.device_type!r}")
        elif entry["identity"] != identity:
            misses.append(
                f"{cert.source} certifies identity {entry['identity'][:16]}, the "
                f"provider is now {identity[:16]} (its source changed)"
            )
        elif any(entry["counts"].get(s) for s in RED):
            failures.append(
                f"{cert.source} records failures for it ({_describe_counts(entry['counts'], RED)})"
            )
        elif not entry["passed"]:
            misses.append(f"{cert.source} records no passing case for it")
        else:
            modes.add(cert.mode)
            sources.append(cert.source)
    if failures:
        why = "; ".join(failures)
        if sources:
            why += f" (the same identity passes in {', '.join(sources)})"
        return {"status": NOT_CERTIFIED, "modes": [], "sources": [], "why": why}
    if modes:
        return {"status": CERTIFIED, "modes": sorted(modes), "sources": sources, "why": None}
    return {
        "status": NOT_CERTIFIED,
        "modes": [],
        "sources": [],
        "why": "; ".join(misses) if misses else "no certificate lists it",
    }


def info(platform: Any = None, config: Any = None) -> dict[str, Any]:
    """For `opcore info`: per op, per provider in use (its effective priority under
    ``config``), its certificate `coverage` on the platform's device type and the
    distribution registering it. Certificates are looked for in the package of each
    provider's function and in the platform's package. ``errors``: certificate files that
    cannot be used (one line each)."""
    from opcore.ir import all_ops
    from opcore.platforms import get_current_platform
    from opcore.platforms.kernels import ensure_kernels_loaded

    platform = platform if platform is not None else get_current_platform()
    ensure_kernels_loaded()
    ops = all_ops()
    packages = {_top_package(type(platform).__module__)}
    in_use: dict[str, list[str]] = {}
    for name, op in ops.items():
        try:
            in_use[name] = list(op.decision(config).names)
        except ValueError:  # an undecidable priority is reported by the ops section
            in_use[name] = op.supported_providers()
        for provider in in_use[name]:
            impl = op.impls.get(provider)
            if impl is not None:
                packages.add(_top_package(getattr(impl.impl_fn, "__module__", None)))
    installed = Installed(p for p in packages if p)
    certificates: list[Certificate] = []
    errors: list[str] = []
    sources: list[str] = []
    for package in sorted(p for p in packages if p):
        found, bad = shipped(package, installed)
        certificates += found
        errors += bad
        sources += [c.source for c in found]
    result: dict[str, dict[str, Any]] = {}
    for name, providers in sorted(in_use.items()):
        result[name] = {}
        for provider in providers:
            impl = ops[name].impls.get(provider)
            if impl is None:
                continue
            identity = impl.identity_hash()
            distribution, why = provider_distribution(impl, installed)
            cov = coverage(
                name,
                provider,
                identity,
                platform.device_type,
                certificates,
                distribution=distribution,
                distribution_unknown=why,
            )
            result[name][provider] = {
                **cov,
                "identity": identity[:16],
                "distribution": distribution,
            }
    return {"device_type": platform.device_type, "found": sources, "errors": errors, "ops": result}
