"""Conformance certificates: reading them, and saying which providers they cover.

A certificate is the ``certificate.json`` every ``opcore conformance`` run writes next to
its reports (the format is documented in docs/conformance.md, "Certificates"). A plugin
ships the ones it stands behind inside its import package, in a ``certificates/`` folder
(``<package>/certificates/*.json``, found with `importlib.resources`, so it works from a
wheel as well as from a source tree).

A provider is *certified* on this device kind in a mode when some certificate found here

- was written on a platform of the same ``device_type``,
- in that ``mode`` (``quick`` or ``full``),
- lists the provider under the same op with the same identity hash
  (`opcore.ir.identity`: a hash of its source, so any edit to the provider's module
  changes it),
- and records no red case (fail, error, xpass) for it.

Otherwise it is "not certified", with the reason. The core only reads this format: the
conformance suite writes it (the core imports no conformance code).
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import Any

FORMAT = "opcore-conformance-certificate"
FORMAT_VERSION = 1
FOLDER = "certificates"

CERTIFIED = "certified"
NOT_CERTIFIED = "not certified"

# The fields a certificate must have for `coverage` to use it.
_REQUIRED = ("format", "format_version", "device_type", "mode", "providers")


class CertificateError(ValueError):
    """A certificate that cannot be used; the message is one line naming the file."""


@dataclasses.dataclass(frozen=True)
class Certificate:
    """One parsed certificate. ``providers``: ``{(op, provider): entry}`` where an entry has
    ``identity`` and ``passed``; ``data``: the whole document."""

    source: str
    device_type: str
    mode: str
    providers: dict[tuple[str, str], dict[str, Any]]
    data: dict[str, Any]


def parse(data: Any, source: str) -> Certificate:
    """Check ``data`` (a decoded certificate) and return it as a `Certificate`."""
    if not isinstance(data, dict):
        raise CertificateError(f"{source}: not a JSON object")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise CertificateError(f"{source}: missing field(s) {', '.join(missing)}")
    if data["format"] != FORMAT:
        raise CertificateError(f"{source}: format is {data['format']!r}, expected {FORMAT!r}")
    if data["format_version"] != FORMAT_VERSION:
        raise CertificateError(
            f"{source}: format_version {data['format_version']!r} is not "
            f"{FORMAT_VERSION} (written by another opcore version)"
        )
    providers: dict[tuple[str, str], dict[str, Any]] = {}
    if not isinstance(data["providers"], list):
        raise CertificateError(f"{source}: providers is not a list")
    for entry in data["providers"]:
        if not (
            isinstance(entry, dict)
            and all(isinstance(entry.get(k), str) for k in ("op", "provider", "identity"))
        ):
            raise CertificateError(f"{source}: a providers entry lacks op, provider or identity")
        providers[(entry["op"], entry["provider"])] = entry
    return Certificate(source, str(data["device_type"]), str(data["mode"]), providers, data)


def load_text(text: str, source: str) -> Certificate:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CertificateError(f"{source}: not valid JSON: {exc}") from None
    return parse(data, source)


def shipped(package: str) -> tuple[list[Certificate], list[str]]:
    """The certificates in ``<package>/certificates/*.json`` and, one line each, the files
    there that could not be used. A package without the folder ships none."""
    try:
        folder = resources.files(package).joinpath(FOLDER)
    except (ModuleNotFoundError, TypeError, ValueError):
        return [], []
    if not folder.is_dir():
        return [], []
    found, errors = [], []
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not (item.name.endswith(".json") and item.is_file()):
            continue
        source = f"{package}/{FOLDER}/{item.name}"
        try:
            found.append(load_text(item.read_text(encoding="utf-8"), source))
        except (CertificateError, OSError, UnicodeDecodeError) as exc:
            errors.append(str(exc) if isinstance(exc, CertificateError) else f"{source}: {exc}")
    return found, errors


def coverage(
    op: str, provider: str, identity: str, device_type: str, certificates: list[Certificate]
) -> dict[str, Any]:
    """Whether ``certificates`` cover this provider on ``device_type``: ``status``
    (`CERTIFIED` or `NOT_CERTIFIED`), ``modes`` (those covered), ``sources`` (the covering
    files) and ``why`` (for "not certified": the nearest miss, in words)."""
    modes: set[str] = set()
    sources: list[str] = []
    misses: list[str] = []
    for cert in certificates:
        entry = cert.providers.get((op, provider))
        if entry is None:
            continue
        if cert.device_type != device_type:
            misses.append(f"{cert.source} is for device type {cert.device_type!r}")
        elif entry["identity"] != identity:
            misses.append(
                f"{cert.source} certifies identity {entry['identity'][:16]}, the "
                f"provider is now {identity[:16]} (its source changed)"
            )
        elif not entry.get("passed", False):
            misses.append(f"{cert.source} records failures for it")
        else:
            modes.add(cert.mode)
            sources.append(cert.source)
    if modes:
        return {"status": CERTIFIED, "modes": sorted(modes), "sources": sources, "why": None}
    return {
        "status": NOT_CERTIFIED,
        "modes": [],
        "sources": [],
        "why": "; ".join(misses) if misses else "no certificate lists it",
    }


def _top_package(module: str | None) -> str | None:
    return module.split(".")[0] if module else None


def info(platform: Any = None, config: Any = None) -> dict[str, Any]:
    """For `opcore info`: per op, per provider in use (its effective priority under
    ``config``), its certificate `coverage` on the platform's device type. Certificates are
    looked for in the package of each provider's function and in the platform's package.
    ``errors``: certificate files that could not be read (one line each)."""
    from opcore.ir.op import all_ops
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
    certificates: list[Certificate] = []
    errors: list[str] = []
    sources: list[str] = []
    for package in sorted(p for p in packages if p):
        found, bad = shipped(package)
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
            result[name][provider] = {
                **coverage(name, provider, identity, platform.device_type, certificates),
                "identity": identity[:16],
            }
    return {"device_type": platform.device_type, "found": sources, "errors": errors, "ops": result}
