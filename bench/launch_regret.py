"""How far the launch model is from each shape's best configuration, read from a recorded
launch sweep (no device needed): the report a vendor fits `opcore.kernels.triton._launch`
to its own device with (docs/tuning.md "Fitting it to another device").

For each record of `bench/sweep_launch.py`'s ``sweep.jsonl`` it takes the launch model's
choice at that shape *now* (`opcore.kernels.triton.spaces`, the launch spaces' defaults)
and divides the time the sweep measured for it by the fastest configuration's. Rows are
grouped by op and token count (the model's regimes follow the token count); a row whose
model or best time has an interquartile range over ``--noisy`` of its median is counted
apart, since such a row ranks configurations by noise. A model choice the sweep did not
time is listed, never guessed.

    TRITON_INTERPRET=1 python bench/launch_regret.py --sweep SWEEP.jsonl [--worst 12] \\
        [--out report.md] [--json report.json]

``TRITON_INTERPRET=1`` sizes the model for 132 multiprocessors (the H200's) on a machine
without a GPU; on the sweep's own device leave it unset.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from opcore.kernels.triton import spaces

NOISY = 0.3


def _key(cfg: dict) -> tuple:
    return tuple(sorted(cfg.items()))


def shape_of(rec: dict) -> tuple:
    """The launch space's shape of a sweep record."""
    if "heads" in rec:
        return tuple(rec["heads"])
    if rec["op"] == "gelu_and_mul":
        return (rec["width"], "tanh")
    return (rec["width"],)


def regret(sweep: list[dict], noisy: float = NOISY) -> dict[str, Any]:
    rows, untimed = [], []
    for rec in sweep:
        sp = spaces.SPACES.get(rec["op"])
        if sp is None:
            continue
        model = dict(sp.default(rec["tokens"], shape_of(rec)))
        timed = {_key(c["config"]): c for c in rec["configs"] if c.get("ok")}
        mine = timed.get(_key(model))
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


def report(result: dict[str, Any], head: dict, worst: int) -> str:
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", required=True, help="bench/sweep_launch.py's sweep.jsonl")
    ap.add_argument("--noisy", type=float, default=NOISY)
    ap.add_argument("--worst", type=int, default=12)
    ap.add_argument("--out", help="write the markdown report here")
    ap.add_argument("--json", help="write the rows and summary here")
    opts = ap.parse_args()
    with open(opts.sweep) as fh:
        head, *sweep = (json.loads(line) for line in fh if line.strip())
    result = regret(sweep, opts.noisy)
    text = report(result, head, opts.worst)
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
