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

Where an edit to a file every provider's identity covers (``_launch.py``, ``spaces.py``)
changed only functions that some ops never call, ``--restamp`` records this process's
identity of those ops' providers in place of the old one, keeping their entries; ``--why``
must name what changed and why those ops' configurations still mean what was measured
(the update keeps both hashes). Run it with the providers importable (on a CPU:
``TRITON_INTERPRET=1 OPCORE_PLATFORM=cpu``). It is a reviewed claim, not a measurement:
where the edit could touch what an op's configuration means, search again instead.

    TRITON_INTERPRET=1 OPCORE_PLATFORM=cpu python bench/tune_merge.py BASE.json \\
        --restamp rms_norm,fused_add_rms_norm --why "_launch.py: only token_head_params changed"

Where an edit changed what an op's configurations mean at some sizes only, ``--drop-tokens
1,32`` with ``--restamp`` also removes those ops' entries at those token buckets (the
update records them); the runtime's nearest-bucket fill then serves those buckets from the
entries kept, so ``--why`` must say why that is right there too.
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


def restamp(
    base: dict[str, Any],
    ops: list[str],
    why: str,
    current: dict[str, dict[str, str]],
    drop_tokens: tuple[int, ...] = (),
) -> dict[str, Any]:
    """``base`` with the provider identities of ``ops`` replaced by ``current`` (op ->
    provider -> this process's identity hash), entries kept except those at the token
    buckets ``drop_tokens`` (an edit that changed what a configuration means at some sizes
    only), the change and ``why`` recorded in ``search.updates``. Each op must have entries
    and recorded identities, keep at least one entry and lose one at each dropped bucket,
    and ``current`` must cover every provider recorded for it."""
    _each_once(ops, "--restamp")
    if not why.strip():
        raise MergeError("--restamp needs --why: the table must say why the entries still hold")
    entries = base["entries"]
    for op in ops:
        mine = {e["tokens"] for e in entries if e["op"] == op}
        missing = sorted(set(drop_tokens) - mine)
        if missing:
            raise MergeError(f"{op!r} has no entry at the token bucket(s) {missing}")
        if mine and mine <= set(drop_tokens):
            raise MergeError(f"--drop-tokens leaves {op!r} no entry: use --drop")
    entries = [e for e in entries if not (e["op"] in ops and e["tokens"] in drop_tokens)]
    providers = {k: dict(v) for k, v in base.get("providers", {}).items()}
    changed = {}
    for op in ops:
        if not any(e["op"] == op for e in base["entries"]):
            raise MergeError(f"the base table has no entry for {op!r}")
        if op not in providers:
            raise MergeError(f"the base table records no provider identity for {op!r}")
        for prov, old in providers[op].items():
            new = current.get(op, {}).get(prov)
            if new is None:
                raise MergeError(f"{op!r} has no provider {prov!r} in this process to restamp")
            if new != old:
                changed[f"{op}/{prov}"] = {"from": old, "to": new}
                providers[op][prov] = new
    if not changed:
        raise MergeError(f"the identities of {ops} already match this process: nothing to do")
    update: dict[str, Any] = {"restamped": changed, "why": why}
    if drop_tokens:
        update["dropped_tokens"] = sorted(drop_tokens)
    return _with(base, entries, providers, update)


def current_identities(ops: list[str], providers: dict[str, dict]) -> dict[str, dict[str, str]]:
    """This process's identity hash of each provider ``providers`` records for ``ops``
    (those it has), with the first-party kernels registered."""
    import importlib

    from opcore.ir import ops as ir_ops

    try:  # registers the triton providers (the package's) and the batch-invariant ones
        importlib.import_module("opcore.kernels.triton.batch_invariant")
    except ImportError:  # no Triton here: its providers are missing, and named below
        pass
    out: dict[str, dict[str, str]] = {}
    for op in ops:
        ir_op = getattr(ir_ops, op, None)
        if ir_op is None:
            continue
        out[op] = {p: ir_op.identity_hash(p) for p in providers.get(op, {}) if p in ir_op.impls}
    return out


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
    p.add_argument("--restamp", help="comma-separated ops whose identities to renew (no NEW)")
    p.add_argument(
        "--drop-tokens",
        help="with --restamp: comma-separated token buckets whose entries of those ops to "
        "remove (the edit changed what their configurations mean)",
    )
    p.add_argument(
        "--why", default="", help="with --drop or --restamp: the reason, kept in the table"
    )
    p.add_argument("--out", help="where to write (default: BASE, in place)")
    a = p.parse_args(argv)
    alone = [x for x in (a.drop, a.restamp) if x is not None]
    if (a.new is None) != (len(alone) == 1) or (a.new is not None) != (a.ops is not None):
        p.error("give NEW with --ops, or --drop or --restamp (with --why) alone")
    if a.drop_tokens is not None and a.restamp is None:
        p.error("--drop-tokens goes with --restamp")
    base = _read(a.base)
    try:
        if a.restamp is not None:
            ops = [o for o in a.restamp.split(",") if o]
            current = current_identities(ops, base.get("providers", {}))
            tokens = tuple(int(t) for t in (a.drop_tokens or "").split(",") if t)
            doc = restamp(base, ops, a.why, current, tokens)
            what = "kept under this code's identity"
            if tokens:
                what += f", but for the token buckets {list(tokens)}"
        elif a.drop is not None:
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
