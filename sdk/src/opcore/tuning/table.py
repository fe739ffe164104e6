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

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opcore.tuning.buckets import MAX_BUCKET, bucket_tokens, shape_problem

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
    index: int = -1  # its position in the table's ``entries`` (for messages)


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
    # Entries left out by ``parse(..., skip_invalid_entries=True)``: "entries[i].field: why"
    invalid: tuple[str, ...] = ()


def _need(cond: bool, source: str, what: str) -> None:
    if not cond:
        raise TuningTableError(f"tuning table {source}: {what}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _names_problem(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        return "must be a list of provider names"
    if len(set(value)) != len(value):
        return f"names a provider twice ({value})"
    return None


def entry_problem(e: Any) -> str | None:
    """``None`` when ``e`` (one decoded item of ``entries``) is a valid entry, else what is
    wrong, starting with the field (``.shape ...``): types, lengths and values, the shape
    checked against its op's declared bucket shape (`opcore.tuning.buckets.shape_problem`)."""
    if not isinstance(e, dict):
        return f" is not an object (got {type(e).__name__})"
    for key in ("op", "dtype"):
        if not isinstance(e.get(key), str):
            return f".{key} must be a str"
        if not e[key]:
            return f".{key} must not be empty"
    tokens = e.get("tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        return f".tokens must be an int, got {tokens!r}"
    if tokens <= 0:
        return ".tokens must be positive"
    if tokens > bucket_tokens(MAX_BUCKET):
        return f".tokens is {tokens}: at most 2**{MAX_BUCKET}"
    if "shape" not in e:
        return ".shape must be a list"
    why = shape_problem(e["op"], e["shape"])
    if why is not None:
        return f".shape {json.dumps(e['shape'])}: {why}"
    why = _names_problem(e.get("order", []))
    if why is not None:
        return f".order {why}"
    configs = e.get("configs", {})
    if not isinstance(configs, dict):
        return ".configs must be an object"
    for prov, cfg in configs.items():
        if not prov:
            return ".configs has an empty provider name"
        if not isinstance(cfg, dict):
            return f".configs[{prov!r}] must be an object"
        for name, value in cfg.items():
            if not name or not _is_int(value):
                return f".configs[{prov!r}] {name}={value!r}: each parameter must be an int"
    return None


def parse(data: Any, *, source: str, digest: str = "", skip_invalid_entries: bool = False) -> Table:
    """A `Table` from a decoded JSON document; `TuningTableError` naming ``source`` and the
    first problem found. With ``skip_invalid_entries``, an invalid entry (`entry_problem`)
    is left out and listed in `Table.invalid` instead (a problem of the document itself
    still raises)."""
    _need(isinstance(data, dict), source, "the document is not a JSON object")
    _need(
        data.get("format") == FORMAT,
        source,
        f"'format' is {data.get('format')!r}, expected {FORMAT!r}",
    )
    version = data.get("version")
    _need(
        _is_int(version) and version == VERSION,
        source,
        f"'version' is {version!r}; this opcore reads version {VERSION} (re-run opcore tune)",
    )
    env = data.get("environment")
    _need(isinstance(env, dict), source, "'environment' must be an object")
    missing = [k for k in ENVIRONMENT_KEYS if k not in env]
    _need(not missing, source, f"'environment' lacks {missing}")
    for k in ENVIRONMENT_KEYS:
        _need(
            env[k] is None or isinstance(env[k], str),
            source,
            f"'environment'.{k} must be a string or null, got {env[k]!r}",
        )
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
    invalid = []
    for i, e in enumerate(raw):
        why = entry_problem(e)
        if why is not None:
            what = f"entries[{i}]{why}"
            _need(skip_invalid_entries, source, what)
            invalid.append(what)
            continue
        entries.append(
            Entry(
                e["op"],
                e["dtype"],
                e["tokens"],
                tuple(e["shape"]),
                tuple(e.get("order", [])),
                e.get("configs", {}),
                index=i,
            )
        )
    return Table(
        source=source,
        environment=dict(env),
        properties=tuple(props),
        providers=providers,
        entries=tuple(entries),
        digest=digest,
        search=data.get("search", {}) if isinstance(data.get("search"), dict) else {},
        invalid=tuple(invalid),
    )


def load(
    path: str | os.PathLike[str],
    *,
    source: str | None = None,
    skip_invalid_entries: bool = False,
) -> Table:
    """Read and parse the table at ``path`` (a path that is not a readable file, a
    directory included, is a `TuningTableError`)."""
    path = Path(path)
    label = source or str(path)
    if not path.is_file():  # a directory named *.json; a FIFO would block the read
        what = "a directory" if path.is_dir() else "no such file" if not path.exists() else ""
        raise TuningTableError(
            f"tuning table {label}: cannot be read ({what or 'not a regular file'})"
        )
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise TuningTableError(f"tuning table {label}: cannot be read ({exc})") from None
    return loads(text, source=label, skip_invalid_entries=skip_invalid_entries)


def loads(text: bytes | str, *, source: str, skip_invalid_entries: bool = False) -> Table:
    """Parse a table from its JSON text."""
    raw = text.encode() if isinstance(text, str) else text
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        if not raw.strip():
            what = "the file is empty"
        raise TuningTableError(f"tuning table {source}: not valid JSON ({what})") from None
    return parse(
        data,
        source=source,
        digest=hashlib.sha256(raw).hexdigest(),
        skip_invalid_entries=skip_invalid_entries,
    )


def out_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a table cannot be written to ``path`` (checked before a search, so a run is not
    lost to where it goes), or ``None``: an existing directory or other non-file, a parent
    that is a file, a directory that cannot be written."""
    path = Path(path)
    if path.is_dir():
        return f"{str(path)!r} is a directory; name a file, e.g. {str(path / 'table.json')!r}"
    if path.exists() and not path.is_file():
        return f"{str(path)!r} exists and is not a regular file"
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists() and not tmp.is_file():
        return f"{str(tmp)!r} (written first, then renamed) exists and is not a regular file"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{str(parent)!r} is not writable"
    return None


def dump(document: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a table document (checked by `parse` first) to ``path``, atomically."""
    parse(json.loads(json.dumps(document)), source=str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
        os.replace(tmp, path)
    except BaseException:  # an error or an interrupt: leave nothing half-written behind
        with contextlib.suppress(OSError):
            if tmp.is_file():
                tmp.unlink()
        raise
