"""Replace some ops' part of a tuning table with a fresh search of those ops.

An edit to a kernel changes its provider's identity, and every entry of a table measured
before it goes stale (reported by `opcore info`, never applied). Re-searching only the
edited ops (``opcore tune --ops A,B`` on the same device, with the same grid) and merging
them here keeps the rest of the table as it was measured.

The two tables must be for the same environment (platform, device, capability, torch,
Triton) and hold the same properties, and the new one must have searched every op named.
For each op named: the base's entries and provider identities are dropped and the new
table's taken, in the new table's order, where the base's first entry for the op stood.
The base's ``search`` record stays; the new one is appended to its ``updates`` list with the
ops it replaced. The result is checked by `opcore.tuning.table.dump` before it is written.

    python bench/tune_merge.py BASE.json NEW.json --ops rotary_embedding,split_qkv_rmsnorm_rope \\
        [--out MERGED.json]        (default: BASE.json, rewritten in place)

Where the table's device is not at hand, ``--drop`` removes the named ops' entries and
identities instead (those ops then launch as their provider's heuristic chooses, as for
any shape without an entry, until a search on that device puts them back); the ``search``
record's ``updates`` list says which ops were dropped and why (``--why``):

    python bench/tune_merge.py BASE.json --drop rotary_embedding,split_qkv_rmsnorm_rope \\
        --why "the rotary kernel changed; not re-searched on this device yet"
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from opcore.tuning import table as tt


class MergeError(ValueError):
    """The two tables cannot be merged; the message says which part differs."""


def _each_once(ops: list[str], flag: str) -> None:
    if not ops or len(set(ops)) != len(ops):
        raise MergeError(f"{flag} must name each op once, got {ops}")


def _with(base: dict[str, Any], entries: list, providers: dict, update: dict) -> dict[str, Any]:
    """``base`` with these entries and provider identities, ``update`` appended to its
    ``search.updates`` (its own search record stays)."""
    search = dict(base.get("search", {}))
    search["updates"] = [*search.get("updates", []), update]
    return {**base, "entries": entries, "providers": providers, "search": search}


def merge(base: dict[str, Any], new: dict[str, Any], ops: list[str]) -> dict[str, Any]:
    """The merged document (``base`` and ``new`` are parsed table documents)."""
    _each_once(ops, "--ops")
    for key in tt.ENVIRONMENT_KEYS:
        a, b = base["environment"].get(key), new["environment"].get(key)
        if a != b:
            raise MergeError(f"environment.{key} differs: base {a!r}, new {b!r}")
    if sorted(base.get("properties", [])) != sorted(new.get("properties", [])):
        raise MergeError(
            f"properties differ: base {base.get('properties')}, new {new.get('properties')}"
        )
    searched = new.get("search", {}).get("ops")
    for op in ops:
        if isinstance(searched, list) and op not in searched:
            raise MergeError(f"the new table did not search {op!r} (it searched {searched})")
        if not any(e["op"] == op for e in new["entries"]):
            raise MergeError(f"the new table has no entry for {op!r}")
        if op not in new.get("providers", {}):
            raise MergeError(f"the new table records no provider identity for {op!r}")
    fresh = [x for x in new["entries"] if x["op"] in ops]
    # The fresh entries stand where the base's first entry of those ops stood (else last).
    kept = [e for e in base["entries"] if e["op"] not in ops]
    at = next((i for i, e in enumerate(base["entries"]) if e["op"] in ops), len(kept))
    providers = {**base.get("providers", {}), **{op: new["providers"][op] for op in ops}}
    return _with(
        base, kept[:at] + fresh + kept[at:], providers, {"replaced_ops": ops, **new["search"]}
    )


def drop(base: dict[str, Any], ops: list[str], why: str) -> dict[str, Any]:
    """``base`` without the entries and provider identities of ``ops`` (each must have
    entries there), the drop recorded in ``search.updates``."""
    _each_once(ops, "--drop")
    if not why.strip():
        raise MergeError("--drop needs --why: the table must say why the entries went")
    for op in ops:
        if not any(e["op"] == op for e in base["entries"]):
            raise MergeError(f"the base table has no entry for {op!r}")
    entries = [e for e in base["entries"] if e["op"] not in ops]
    providers = {k: v for k, v in base.get("providers", {}).items() if k not in ops}
    return _with(base, entries, providers, {"dropped_ops": ops, "why": why})


def _read(path: str) -> dict[str, Any]:
    tt.load(path)  # a malformed table stops here, named
    with open(path) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base")
    p.add_argument("new", nargs="?", help="the fresh search's table (not with --drop)")
    p.add_argument("--ops", help="comma-separated ops to take from NEW")
    p.add_argument("--drop", help="comma-separated ops whose entries to remove (no NEW)")
    p.add_argument("--why", default="", help="with --drop: the reason, kept in the table")
    p.add_argument("--out", help="where to write (default: BASE, in place)")
    a = p.parse_args(argv)
    if (a.new is None) == (a.drop is None) or (a.new is not None) != (a.ops is not None):
        p.error("give NEW with --ops, or --drop (with --why) alone")
    base = _read(a.base)
    try:
        if a.drop is not None:
            ops = [o for o in a.drop.split(",") if o]
            doc, what = drop(base, ops, a.why), "dropped"
        else:
            ops = [o for o in a.ops.split(",") if o]
            doc, what = merge(base, _read(a.new), ops), f"taken from {a.new}"
    except MergeError as exc:
        print(f"tune_merge: {exc}", file=sys.stderr)
        return 2
    tt.dump(doc, a.out or a.base)
    print(f"{a.out or a.base}: the entries of {','.join(ops)} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
