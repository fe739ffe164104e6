"""`opcore tune`: measure, per op x shape bucket x dtype, the fastest correct launch choice.

Every candidate (each provider that accepts the arguments, with its heuristic and each
configuration of its declared launch space) is checked against the float64 reference
with the conformance suite's error budget before it is timed; a wrong one is recorded as
rejected and never chosen. Timing is device time (graph replay at decode sizes where the
platform has graphs); a choice replaces the heuristic only when it is faster beyond
noise. Writes a tuning table (JSON; docs/tuning.md) to ``--out``, by default into the user
cache dir, where dispatch finds it. Torch loads only when the command runs.
"""

from __future__ import annotations

import argparse
import sys

from opcore.bench import shapes

DTYPES = ("bfloat16", "float16", "float32")


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def _dtypes(text: str) -> tuple[str, ...]:
    names = _names(text)
    bad = [n for n in names if n not in DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {bad}; choose from {DTYPES}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tune",
        help="measure and write a tuning table (correctness-gated launch choices per shape)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--ops", type=_names, default=shapes.OPS, help="comma-separated ops")
    p.add_argument(
        "--tokens",
        type=_ints,
        default=(1, 32, 4096, 32768),
        help="token counts, one bucket each (default: 1,32,4096,32768)",
    )
    p.add_argument(
        "--hidden",
        type=_ints,
        default=shapes.HIDDEN,
        help="model hidden sizes; activations and heads follow the bench's Llama layouts "
        f"(default: {','.join(map(str, shapes.HIDDEN))})",
    )
    p.add_argument("--dtypes", type=_dtypes, default=("bfloat16",), help="default: bfloat16")
    p.add_argument(
        "--budget-s",
        type=float,
        default=180.0,
        help="wall-clock budget of the whole search, in seconds (default: 180)",
    )
    p.add_argument("--out", default=None, help="table path (default: the user cache dir)")
    p.add_argument(
        "--providers", type=_names, default=None, help="only these providers (default: all)"
    )
    p.add_argument(
        "--properties",
        type=_names,
        default=(),
        help="properties the choice must keep across sizes (batch_invariant: one "
        "reduction order per shape for every token bucket)",
    )
    p.add_argument(
        "--rep-ms",
        type=float,
        default=60.0,
        help="milliseconds per timer per candidate (device timers; opcore bench's default, "
        "so that both take the same samples)",
    )
    p.add_argument("--quick", action="store_true", help="the bench's small CPU shapes")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from opcore.properties import check_names
    from opcore.tuning import search

    if args.budget_s <= 0:
        print("opcore tune: --budget-s must be positive", file=sys.stderr)
        return 2
    try:
        props = tuple(check_names(args.properties, where="opcore tune --properties"))
    except ValueError as exc:
        print(f"opcore tune: {exc}", file=sys.stderr)
        return 2
    opts = search.Options(
        ops=args.ops,
        tokens=args.tokens,
        hidden=args.hidden,
        dtypes=tuple(getattr(torch, d) for d in args.dtypes),
        budget_s=args.budget_s,
        out=args.out,
        quick=args.quick,
        providers=args.providers,
        properties=props,
        rep_ms=args.rep_ms,
    )
    try:
        doc = search.run(opts)
    except (ValueError, AttributeError) as exc:
        print(f"opcore tune: {exc}", file=sys.stderr)
        return 2
    entries = doc["entries"]
    rejected = sum(len(e["rejected"]) for e in entries)
    changed = sum(
        1
        for e in entries
        if e["order"] and (e["order"][0] != e["incumbent"] or e["best"][e["order"][0]]["config"])
    )
    s = doc["search"]
    print(
        f"opcore tune: {len(entries)} bucket(s), {changed} changed from the heuristic, "
        f"{rejected} candidate(s) rejected by the gate, {s['spent_s']} s of {s['budget_s']} s; "
        f"{len(s['skipped_for_budget'])} bucket(s) skipped for the budget"
    )
    print(f"opcore tune: table written to {doc['path']}")
    return 0
