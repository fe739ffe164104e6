"""Reports read from a recorded launch sweep (`bench/sweep_launch.py`'s ``sweep.jsonl``), no
device needed: how far the launch model is from each shape's best configuration, and what
lending a tuning table's configurations to untuned shapes would cost or gain.

``regret``: for each record, the launch model's choice at that shape *now*
(`opcore.kernels.triton.spaces`, the launch spaces' defaults) and the time the sweep
measured for it over the fastest configuration's, grouped by op and token count (the
model's regimes follow the token count). A row whose model or best time has an
interquartile range over ``--noisy`` of its median is counted apart, since such a row
ranks configurations by noise. This is the report a vendor fits
`opcore.kernels.triton._launch` to its own device with (docs/tuning.md "Fitting it to
another device").

``lend``: for each record, the configuration `opcore.tuning.lend.lend_row` lends from
``--table``'s tuned shapes (nothing where the model applies), its measured time over the
model's choice's, in the sweep's one run; the table's own shapes are reported apart (the
table's configuration against the model's). ``--filled`` lends each tuned shape's
token-filled row instead of its measured buckets (the rule `lend_row` rejects, for
comparison).

A configuration the sweep did not time is counted as such, never guessed.

    TRITON_INTERPRET=1 python bench/sweep_report.py regret --sweep SWEEP.jsonl [--worst 12]
    TRITON_INTERPRET=1 python bench/sweep_report.py lend --sweep SWEEP.jsonl --table T.json \\
        [--filled]
    (either: [--out report.md] [--json report.json])

``TRITON_INTERPRET=1`` sizes the launch model for 132 multiprocessors (an H200's, the
figure `opcore.kernels.triton._launch` was fitted on) on a machine without a GPU; on the
sweep's own device leave it unset.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from opcore.bench.report import write_json
from opcore.kernels.triton import PROVIDER, spaces
from opcore.tuning import buckets, space, table
from opcore.tuning.lend import lend_row

NOISY = 0.3


def config_key(cfg: dict) -> tuple:
    return tuple(sorted(cfg.items()))


def shape_of(rec: dict) -> tuple:
    """The launch space's shape of a sweep record."""
    if "heads" in rec:
        return tuple(rec["heads"])
    if rec["op"] == "gelu_and_mul":
        return (rec["width"], "tanh")
    return (rec["width"],)


def regret(sweep: list[dict], noisy: float = NOISY, defaults: dict | None = None) -> dict[str, Any]:
    """The launch model's regret per sweep shape; ``defaults`` (op -> ``f(tokens, shape)``)
    puts a candidate rule in place of an op's launch space default."""
    rows, untimed = [], []
    for rec in sweep:
        sp = spaces.SPACES.get(rec["op"])
        if sp is None:
            continue
        default = (defaults or {}).get(rec["op"], sp.default)
        model = dict(default(rec["tokens"], shape_of(rec)))
        timed = {config_key(c["config"]): c for c in rec["configs"] if c.get("ok")}
        mine = timed.get(config_key(model))
        if mine is None or not timed:
            untimed.append({"op": rec["op"], "shape": list(shape_of(rec)),
                            "tokens": rec["tokens"], "model": model})  # fmt: skip
            continue
        best = min(timed.values(), key=lambda c: c["us"])
        rows.append(
            {
                "op": rec["op"],
                "shape": list(shape_of(rec)),
                "tokens": rec["tokens"],
                "model": model,
                "model_us": mine["us"],
                "best": best["config"],
                "best_us": best["us"],
                "regret": round(mine["us"] / best["us"], 4),
                "noisy": max(mine.get("iqr") or 0.0, best.get("iqr") or 0.0) > noisy,
                "timer": mine.get("timer"),
            }
        )
    groups: dict[str, dict[str, Any]] = {}
    for r in rows:
        g = groups.setdefault(f"{r['op']} T={r['tokens']}", {"clean": [], "noisy": 0})
        if r["noisy"]:
            g["noisy"] += 1
        else:
            g["clean"].append(r["regret"])
    summary = {
        name: {
            "rows": len(g["clean"]) + g["noisy"],
            "noisy": g["noisy"],
            "geomean": round(math.exp(sum(map(math.log, g["clean"])) / len(g["clean"])), 4)
            if g["clean"]
            else None,
            "max": max(g["clean"]) if g["clean"] else None,
        }
        for name, g in groups.items()
    }
    return {"noisy_above": noisy, "summary": summary, "rows": rows, "model_not_timed": untimed}


def regret_report(result: dict[str, Any], head: dict, worst: int) -> str:
    lines = [
        f"# Launch model regret over the sweep of {head.get('device')} ({head.get('date')}, "
        f"torch {head.get('torch')})",
        "",
        "Regret: the launch model's configuration's time over the fastest one's, at each "
        f"shape. Rows whose model or best time spreads over {result['noisy_above']:.0%} "
        "(interquartile range over median) are counted as noisy and left out of the means.",
        "",
        "| op, tokens | rows | noisy | geomean regret | worst |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in result["summary"].items():
        lines.append(f"| {name} | {s['rows']} | {s['noisy']} | {s['geomean']} | {s['max']} |")
    clean = sorted((r for r in result["rows"] if not r["noisy"]), key=lambda r: -r["regret"])
    lines += [
        "",
        f"Worst {worst} clean rows:",
        "",
        "| op | shape | tokens | model | us | best | us | regret |",
        "|---|---|---:|---|---:|---|---:|---:|",
    ]
    for r in clean[:worst]:
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['tokens']} | {r['model']} | {r['model_us']} | "
            f"{r['best']} | {r['best_us']} | {r['regret']} |"
        )
    if result["model_not_timed"]:
        lines += ["", "The sweep did not time the model's choice at:", ""]
        lines += [
            f"- {u['op']} {u['shape']} x {u['tokens']}: {u['model']}"
            for u in result["model_not_timed"]
        ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- lend
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


def lend(sweep: list[dict], doc: table.Table, filled: bool) -> dict[str, Any]:
    points = tuned_points(doc)
    rows = []
    for rec in sweep:
        op, shape, tokens = rec["op"], shape_of(rec), rec["tokens"]
        sp = space.space_for(op, PROVIDER)
        if sp is None:
            continue
        tuned = points.get((op, rec["dtype"]), {})
        if filled:
            tuned = {s: dict(enumerate(buckets.fill_buckets(p))) for s, p in tuned.items()}
        b = buckets.token_bucket(tokens)
        times = {config_key(c["config"]): c["us"] for c in rec["configs"] if c.get("ok")}
        model = dict(sp.default(tokens, shape))
        if shape in tuned:
            kind = "tuned"
            cfg = buckets.fill_buckets(tuned[shape])[b]
            lender = shape
        else:
            kind = "borrower"
            row, by = lend_row(sp, shape, tuned)
            cfg, lender = row[b], by[b]
        t_model, t_cfg = (
            times.get(config_key(model)),
            None if cfg is None else times.get(config_key(cfg)),
        )
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


def lend_report(result: dict[str, Any], head: dict, table_label: str) -> str:
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
    sub = ap.add_subparsers(dest="report", required=True)
    for name, text in (("regret", "the launch model against each shape's best"),
                       ("lend", "lent configurations against the model")):  # fmt: skip
        p = sub.add_parser(name, help=text)
        p.add_argument("--sweep", required=True, help="bench/sweep_launch.py's sweep.jsonl")
        p.add_argument("--out", help="write the markdown report here")
        p.add_argument("--json", help="write the rows and summary here")
        if name == "regret":
            p.add_argument("--noisy", type=float, default=NOISY)
            p.add_argument("--worst", type=int, default=12)
        else:
            p.add_argument("--table", required=True, help="a tuning table (opcore tune --out)")
            p.add_argument("--filled", action="store_true", help="lend token-filled rows")
    opts = ap.parse_args()
    with open(opts.sweep) as fh:
        head, *sweep = (json.loads(line) for line in fh if line.strip())
    if opts.report == "regret":
        result = regret(sweep, opts.noisy)
        text = regret_report(result, head, opts.worst)
    else:
        result = lend(sweep, table.load(opts.table), opts.filled)
        text = lend_report(result, head, opts.table)
    print(text, end="")
    if opts.out:
        with open(opts.out, "w") as fh:
            fh.write(text)
    if opts.json:
        write_json(result, opts.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
