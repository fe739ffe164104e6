"""The tuning table: a versioned JSON document of measured launch choices.

Format (``format`` and ``version`` are checked first; docs/tuning.md is the reference)::

    {
      "format": "opcore-tuning-table",
      "version": 1,
      "environment": {"platform": "cuda", "device": "NVIDIA H200", "capability": "9.0",
                      "torch": "2.11.0+cu128", "triton": "3.6.0"},
      "properties": [],                       # e.g. ["batch_invariant"]: held while tuning
      "providers": {"rms_norm": {"triton": "<identity hash>", ...}, ...},
      "search": {...},                        # how it was measured (free form, reported)
      "entries": [
        {"op": "rms_norm", "dtype": "bfloat16", "tokens": 4096, "shape": [4096],
         "order": ["triton", "native"],       # measured provider order for the bucket
         "configs": {"triton": {"BLOCK_N": 4096, "ROWS": 1, "num_warps": 8}},
         "measured": {...}, "rejected": [...]}   # evidence, not read by dispatch
      ]
    }

An entry applies to the token bucket of its ``tokens`` (`opcore.tuning.buckets`) at its
exact ``shape``. A table applies on the device its ``environment`` names (platform,
device, capability); there, torch and Triton versions must match too, and a provider's
part only while its identity hash (`opcore.ir.Impl.identity_hash`) is the one recorded:
anything else is stale.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FORMAT = "opcore-tuning-table"
VERSION = 1
ENVIRONMENT_KEYS = ("platform", "device", "capability", "torch", "triton")
DEVICE_KEYS = ("platform", "device", "capability")  # which machine a table is for


class TuningTableError(ValueError):
    """A malformed tuning table; the message names the file and the bad part."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One op x dtype x bucket: the measured provider order and each provider's config."""

    op: str
    dtype: str
    tokens: int
    shape: tuple
    order: tuple[str, ...]
    configs: Mapping[str, Mapping[str, int]]


@dataclasses.dataclass(frozen=True)
class Table:
    """A parsed table. ``source`` says where it came from; ``digest`` hashes its text."""

    source: str
    environment: Mapping[str, Any]
    properties: tuple[str, ...]
    providers: Mapping[str, Mapping[str, str]]
    entries: tuple[Entry, ...]
    digest: str
    search: Mapping[str, Any]


def _need(cond: bool, source: str, what: str) -> None:
    if not cond:
        raise TuningTableError(f"tuning table {source}: {what}")


def parse(data: Any, *, source: str, digest: str = "") -> Table:
    """A `Table` from a decoded JSON document; `TuningTableError` naming ``source`` and the
    first problem found."""
    _need(isinstance(data, dict), source, "the document is not a JSON object")
    _need(
        data.get("format") == FORMAT,
        source,
        f"'format' is {data.get('format')!r}, expected {FORMAT!r}",
    )
    version = data.get("version")
    _need(
        version == VERSION,
        source,
        f"'version' is {version!r}; this opcore reads version {VERSION} (re-run opcore tune)",
    )
    env = data.get("environment")
    _need(isinstance(env, dict), source, "'environment' must be an object")
    missing = [k for k in ENVIRONMENT_KEYS if k not in env]
    _need(not missing, source, f"'environment' lacks {missing}")
    props = data.get("properties", [])
    _need(
        isinstance(props, list) and all(isinstance(p, str) for p in props),
        source,
        "'properties' must be a list of names",
    )
    providers = data.get("providers", {})
    _need(isinstance(providers, dict), source, "'providers' must be an object")
    for op, ids in providers.items():
        _need(
            isinstance(ids, dict) and all(isinstance(v, str) for v in ids.values()),
            source,
            f"providers[{op!r}] must map provider names to identity hashes",
        )
    raw = data.get("entries")
    _need(isinstance(raw, list), source, "'entries' must be a list")
    entries = []
    for i, e in enumerate(raw):
        where = f"entries[{i}]"
        _need(isinstance(e, dict), source, f"{where} is not an object")
        for key, kind in (("op", str), ("dtype", str), ("tokens", int), ("shape", list)):
            _need(isinstance(e.get(key), kind), source, f"{where}.{key} must be a {kind.__name__}")
        _need(e["tokens"] > 0, source, f"{where}.tokens must be positive")
        order = e.get("order", [])
        _need(
            isinstance(order, list) and all(isinstance(p, str) for p in order),
            source,
            f"{where}.order must be a list of provider names",
        )
        configs = e.get("configs", {})
        _need(isinstance(configs, dict), source, f"{where}.configs must be an object")
        for prov, cfg in configs.items():
            _need(isinstance(cfg, dict), source, f"{where}.configs[{prov!r}] must be an object")
        entries.append(
            Entry(e["op"], e["dtype"], e["tokens"], tuple(e["shape"]), tuple(order), configs)
        )
    return Table(
        source=source,
        environment=dict(env),
        properties=tuple(props),
        providers=providers,
        entries=tuple(entries),
        digest=digest,
        search=data.get("search", {}) if isinstance(data.get("search"), dict) else {},
    )


def load(path: str | os.PathLike[str], *, source: str | None = None) -> Table:
    """Read and parse the table at ``path``."""
    path = Path(path)
    label = source or str(path)
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise TuningTableError(f"tuning table {label}: cannot be read ({exc})") from None
    return loads(text, source=label)


def loads(text: bytes | str, *, source: str) -> Table:
    """Parse a table from its JSON text."""
    raw = text.encode() if isinstance(text, str) else text
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise TuningTableError(f"tuning table {source}: not valid JSON ({exc})") from None
    return parse(data, source=source, digest=hashlib.sha256(raw).hexdigest())


def dump(document: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a table document (checked by `parse` first) to ``path``, atomically."""
    parse(json.loads(json.dumps(document)), source=str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
