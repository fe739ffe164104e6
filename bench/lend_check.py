"""What lending a tuning table's configurations to untuned shapes would cost or gain, read
from a recorded launch sweep (no device needed).

`bench/sweep_launch.py` times every launch configuration of the triton norm, activation
and head kernels at many real-model shapes on a device. For each of its shapes this takes
the configuration `opcore.tuning.runtime.lend_row` lends from ``--table``'s tuned shapes
(the launch model's choice where nothing is lent) and looks up the time the sweep measured
for it and for the model's own choice, in that one run. A row whose lent configuration the
sweep did not time is counted as such, never guessed.

    TRITON_INTERPRET=1 python bench/lend_check.py --sweep SWEEP.jsonl --table TABLE.json \\
        [--filled] [--out report.md] [--json report.json]

``TRITON_INTERPRET=1`` sizes the launch model for 132 multiprocessors (an H200's, the
figure `opcore.kernels.triton._launch` was fitted on) on a machine without a GPU: run it
where the sweep's device was, or with its multiprocessor count. ``--filled`` lends each
tuned shape's token-filled row instead of its measured buckets (the rule `lend_row`
rejects, for comparison). The table's own shapes are reported apart: there the table's
configuration is compared with the model's in the same way.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from opcore.kernels.triton import PROVIDER  # registers the triton launch spaces
from opcore.tuning import buckets, runtime, space, table


def tuned_points(doc: table.Table) -> dict[tuple, dict[tuple, dict[int, Any]]]:
    """``(op, dtype) -> {shape: {bucket: config}}`` of the triton provider's entries."""
    out: dict[tuple, dict[tuple, dict[int, Any]]] = {}
    for e in doc.entries:
        cfg = e.configs.get(PROVIDER)
        if cfg is not None:
            shapes = out.setdefault((e.op, e.dtype), {})
            shapes.setdefault(tuple(e.shape), {}).setdefault(
                buckets.token_bucket(e.tokens), dict(cfg)
            )
    return out


def _key(cfg: dict) -> tuple:
    return tuple(sorted(cfg.items()))


def shape_of(rec: dict) -> tuple:
    """The bucket shape of a sweep record (its heads for the head kernels)."""
    if "heads" in rec:
        return tuple(rec["heads"])
    if rec["op"] == "gelu_and_mul":
        return (rec["width"], "tanh")
    return (rec["width"],)


def check(sweep: list[dict], doc: table.Table, filled: bool) -> dict[str, Any]:
    points = tuned_points(doc)
    rows = []
    for rec in sweep:
        op, shape, tokens = rec["op"], shape_of(rec), rec["tokens"]
        sp = space.space_for(op, PROVIDER)
        if sp is None:
            continue
        tuned = points.get((op, rec["dtype"]), {})
        if filled:
            tuned = {s: dict(enumerate(runtime.fill_buckets(p))) for s, p in tuned.items()}
        b = buckets.token_bucket(tokens)
        times = {_key(c["config"]): c["us"] for c in rec["configs"] if c.get("ok")}
        model = dict(sp.default(tokens, shape))
        if shape in tuned:
            kind = "tuned"
            cfg = runtime.fill_buckets(tuned[shape])[b]
            lender = shape
        else:
            kind = "borrower"
            row, by = runtime.lend_row(sp, shape, tuned)
            cfg, lender = row[b], by[b]
        t_model, t_cfg = times.get(_key(model)), None if cfg is None else times.get(_key(cfg))
        rows.append(
            {
                "op": op,
                "shape": list(shape),
                "tokens": tokens,
                "kind": kind,
                "model": model,
                "model_us": t_model,
                "config": cfg,
                "lender": None if lender is None else list(lender),
                "config_us": t_cfg,
                "best_us": min(times.values()) if times else None,
                "ratio": None if not (t_cfg and t_model) else round(t_cfg / t_model, 4),
            }
        )
    summary = {}
    for kind in ("borrower", "tuned"):
        mine = [r for r in rows if r["kind"] == kind]
        lent = [r for r in mine if r["config"] is not None]
        timed = [r["ratio"] for r in lent if r["ratio"] is not None]
        summary[kind] = {
            "rows": len(mine),
            "with_a_config": len(lent),
            "config_not_timed": len(lent) - len(timed),
            "same_as_model": sum(1 for r in lent if r["config"] == r["model"]),
            "geomean_ratio": round(math.exp(sum(map(math.log, timed)) / len(timed)), 4)
            if timed
            else None,
            "min_ratio": min(timed) if timed else None,
            "max_ratio": max(timed) if timed else None,
        }
    return {"filled": filled, "summary": summary, "rows": rows}


def report(result: dict[str, Any], head: dict, table_label: str) -> str:
    s = result["summary"]
    lines = [
        f"# Lending check: {table_label} over the sweep of {head.get('device')} "
        f"({head.get('date')}, torch {head.get('torch')})",
        "",
        f"Lenders: {'token-filled rows' if result['filled'] else 'measured buckets only'}. "
        "Ratio: the lent (or, at a tuned shape, the table's) configuration's time over the "
        "launch model's, both from the sweep's one run.",
        "",
        "| rows | shapes | with a config | same as the model | not timed | geomean | min | max |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, label in (("borrower", "untuned (lent)"), ("tuned", "the table's own")):
        k = s[kind]
        lines.append(
            f"| {label} | {k['rows']} | {k['with_a_config']} | {k['same_as_model']} | "
            f"{k['config_not_timed']} | {k['geomean_ratio']} | {k['min_ratio']} | "
            f"{k['max_ratio']} |"
        )
    lines += [
        "",
        "| op | shape | tokens | kind | model | model us | config (lender) | us | ratio |",
        "|---|---|---:|---|---|---:|---|---:|---:|",
    ]
    for r in result["rows"]:
        if r["config"] is None:
            continue
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['tokens']} | {r['kind']} | {r['model']} | "
            f"{r['model_us']} | {r['config']} ({r['lender']}) | {r['config_us']} | "
            f"{r['ratio']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", required=True, help="bench/sweep_launch.py's sweep.jsonl")
    ap.add_argument("--table", required=True, help="a tuning table (opcore tune --out)")
    ap.add_argument("--filled", action="store_true", help="lend token-filled rows")
    ap.add_argument("--out", help="write the markdown report here")
    ap.add_argument("--json", help="write the rows and summary here")
    opts = ap.parse_args()
    with open(opts.sweep) as fh:
        head, *sweep = (json.loads(line) for line in fh if line.strip())
    doc = table.load(opts.table)
    result = check(sweep, doc, opts.filled)
    text = report(result, head, opts.table)
    print(text, end="")
    if opts.out:
        with open(opts.out, "w") as fh:
            fh.write(text)
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
