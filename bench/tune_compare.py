"""Before/after of a tuning table: `opcore bench` records with tuning off and on, per row.

Each row is one op x layout x token count of the ``triton`` provider. The time compared is
graph replay at 1-32 tokens (where recorded), else the device time. A row is "tuned" when
the table has an entry for its op, dtype, token count and shape, else "unseen" (another
hidden size or token count: the table's nearest bucket, or the heuristic). When the "on"
run also timed peers, the best peer and opcore's ratio to it are shown.

    python bench/tune_compare.py --table T.json --off OFF/bench.json --on ON/bench.json \
        [--out compare.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

PROVIDER = "triton"


def _time(rec: dict[str, Any]) -> float | None:
    if rec.get("tokens", 0) <= 32 and rec.get("graph_us"):
        return float(rec["graph_us"])
    value = rec.get("device_us") or rec.get("cpu_us")
    return None if value is None else float(value)


def _rows(path: str) -> dict[tuple, dict[str, dict[str, Any]]]:
    with open(path) as f:
        records = json.load(f)["records"]
    rows: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in records:
        if r.get("skipped") or r.get("error") or _time(r) is None:
            continue
        rows.setdefault((r["op"], r["layout"], r["tokens"], r["hidden"]), {})[r["provider"]] = r
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", required=True)
    ap.add_argument("--off", required=True)
    ap.add_argument("--on", required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    with open(args.table) as f:
        table = json.load(f)
    off, on = _rows(args.off), _rows(args.on)
    tuned_tokens: dict[tuple, set[int]] = {}
    for e in table["entries"]:
        tuned_tokens.setdefault((e["op"],), set()).add(e["tokens"])
    hidden_tuned = set(table["search"].get("hidden", []))
    lines = [
        "# Tuning table before/after (`opcore bench`, provider triton)",
        "",
        f"- table: {table['environment']}",
        f"- search: {table['search'].get('spent_s')} s of {table['search'].get('budget_s')} s "
        f"budget, timer {table['search'].get('timer')}; "
        f"{sum(len(e['rejected']) for e in table['entries'])} candidates rejected by the gate",
        "- time: graph replay at 1-32 tokens, else device time (median, us); speedup = off / on",
        "",
        "| kind | op | layout | tokens | off (us) | on (us) | speedup | best peer | on / peer |",
        "|---|---|---|---:|---:|---:|---:|---|---:|",
    ]
    speedups: dict[str, list[float]] = {"tuned": [], "unseen": []}
    within = ahead = compared = 0
    for key in sorted(set(off) & set(on), key=lambda k: (k[0], k[3], k[1], k[2])):
        op, layout, tokens, hidden = key
        a, b = off[key].get(PROVIDER), on[key].get(PROVIDER)
        if a is None or b is None:
            continue
        ta, tb = _time(a), _time(b)
        assert ta is not None and tb is not None
        tuned = hidden in hidden_tuned and tokens in tuned_tokens.get((op,), set())
        kind = "tuned" if tuned else "unseen"
        speedups[kind].append(ta / tb)
        peers = {p: _time(r) for p, r in on[key].items() if p != PROVIDER and _time(r)}
        peer_txt = ratio_txt = ""
        if peers:
            best = min(peers, key=lambda p: peers[p] or float("inf"))
            tp = peers[best]
            assert tp is not None
            peer_txt, ratio_txt = f"{best} {tp:.2f}", f"{tb / tp:.3f}"
            compared += 1
            within += tb <= 1.03 * tp
            ahead += tb <= tp
        lines.append(
            f"| {kind} | {op} | {layout} | {tokens} | {ta:.2f} | {tb:.2f} | {ta / tb:.3f} | "
            f"{peer_txt} | {ratio_txt} |"
        )
    lines.append("")
    for kind, values in speedups.items():
        if values:
            lines.append(
                f"- {kind} rows: {len(values)}, geometric-mean speedup "
                f"{statistics.geometric_mean(values):.3f}, worst {min(values):.3f}, "
                f"best {max(values):.3f}"
            )
    if compared:
        lines.append(
            f"- against the best peer: within 3 % on {within}/{compared} rows, at or ahead "
            f"on {ahead}/{compared}"
        )
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
