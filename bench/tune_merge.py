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


def merge(base: dict[str, Any], new: dict[str, Any], ops: list[str]) -> dict[str, Any]:
    """The merged document (``base`` and ``new`` are parsed table documents)."""
    if not ops or len(set(ops)) != len(ops):
        raise MergeError(f"--ops must name each op once, got {ops}")
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
    entries: list[dict[str, Any]] = []
    placed = False
    for e in base["entries"]:
        if e["op"] in ops:
            if not placed:
                entries.extend(x for x in new["entries"] if x["op"] in ops)
                placed = True
            continue
        entries.append(e)
    if not placed:
        entries.extend(x for x in new["entries"] if x["op"] in ops)
    out = dict(base)
    out["entries"] = entries
    out["providers"] = {**base.get("providers", {}), **{op: new["providers"][op] for op in ops}}
    search = dict(base.get("search", {}))
    search["updates"] = [*search.get("updates", []), {"replaced_ops": ops, **new["search"]}]
    out["search"] = search
    return out


def drop(base: dict[str, Any], ops: list[str], why: str) -> dict[str, Any]:
    """``base`` without the entries and provider identities of ``ops`` (each must have
    entries there), the drop recorded in ``search.updates``."""
    if not ops or len(set(ops)) != len(ops):
        raise MergeError(f"--drop must name each op once, got {ops}")
    if not why.strip():
        raise MergeError("--drop needs --why: the table must say why the entries went")
    for op in ops:
        if not any(e["op"] == op for e in base["entries"]):
            raise MergeError(f"the base table has no entry for {op!r}")
    out = dict(base)
    out["entries"] = [e for e in base["entries"] if e["op"] not in ops]
    out["providers"] = {k: v for k, v in base.get("providers", {}).items() if k not in ops}
    search = dict(base.get("search", {}))
    search["updates"] = [*search.get("updates", []), {"dropped_ops": ops, "why": why}]
    out["search"] = search
    return out


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
    if a.drop is not None:
        tt.load(a.base)
        with open(a.base) as f:
            doc = json.load(f)
        try:
            dropped = drop(doc, [o for o in a.drop.split(",") if o], a.why)
        except MergeError as exc:
            print(f"tune_merge: {exc}", file=sys.stderr)
            return 2
        tt.dump(dropped, a.out or a.base)
        gone = len(doc["entries"]) - len(dropped["entries"])
        print(f"{a.out or a.base}: {gone} entries of {a.drop} dropped")
        return 0
    docs = []
    for path in (a.base, a.new):
        tt.load(path)  # a malformed table stops here, named
        with open(path) as f:
            docs.append(json.load(f))
    try:
        merged = merge(docs[0], docs[1], [o for o in a.ops.split(",") if o])
    except MergeError as exc:
        print(f"tune_merge: {exc}", file=sys.stderr)
        return 2
    tt.dump(merged, a.out or a.base)
    replaced = sum(e["op"] in a.ops.split(",") for e in merged["entries"])
    print(f"{a.out or a.base}: {replaced} entries of {a.ops} from {a.new}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
