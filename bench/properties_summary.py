"""Summarise the property checks of an `opcore conformance` run (docs/properties.md).

Reads the run's ``conformance.jsonl`` and writes one Markdown table: per op, provider and
dtype, each property (``batch_invariant`` from ``batch_invariance``, ``deterministic``
from ``determinism``, ``capture_safe`` from ``capture_safety``) as declared / holds,
with the failures and the "could claim" findings listed below it. The attention
backends' checks (``attention.batch_invariance`` ...) appear as op ``attention``, one row
per backend variant.

    python bench/properties_summary.py RUN/conformance.jsonl [--out properties.md]
"""

from __future__ import annotations

import argparse
import collections
import json

CHECKS = {
    "batch_invariance": "batch_invariant",
    "determinism": "deterministic",
    "capture_safety": "capture_safe",
}


def summarise(path: str) -> str:
    cells: dict[tuple, dict[str, list[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    failures, claims = [], []
    refuted: set[tuple] = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            # The attention backends' checks (attention.batch_invariance, ...) count too,
            # per backend variant (the case's sample).
            check = (r.get("check") or "").removeprefix("attention.")
            if r.get("type") != "case" or check not in CHECKS:
                continue
            prop = CHECKS[check]
            details = r.get("details") or {}
            provider = r["provider"]
            if r["check"].startswith("attention.") and r.get("sample"):
                provider = f"{provider} ({r['sample']})"
            key = (r["op"], provider, r["dtype"])
            status = r["status"]
            if status == "pass":
                mark = "declared, holds" if details.get("declared") else "holds (could claim)"
            elif status == "fail":
                mark = "DECLARED, FAILS"
                failures.append(f"- `{r['id']}`: {r['message']}")
            elif status == "unsupported" and "does not declare" in (r.get("message") or ""):
                mark = "not declared, does not hold"
                refuted.add((r["op"], provider, r["dtype"], prop))
            else:
                mark = status
            cells[key][prop].append(mark)
            if details.get("could_claim"):
                claims.append((r["op"], provider, r["dtype"], prop))
    lines = [
        "| op | provider | dtype | " + " | ".join(CHECKS.values()) + " |",
        "|---|---|---|" + "---|" * len(CHECKS),
    ]
    for (op, provider, dtype), props in sorted(cells.items()):
        shown = []
        for prop in CHECKS.values():
            marks = collections.Counter(props.get(prop, []))
            shown.append(", ".join(f"{m} x{n}" if n > 1 else m for m, n in marks.items()) or "")
        lines.append(f"| {op} | {provider} | {dtype} | " + " | ".join(shown) + " |")
    lines += ["", f"## Declared but failing ({len(failures)})", "", *(failures or ["none"])]
    grouped: dict[tuple, set] = collections.defaultdict(set)
    for op, provider, dtype, prop in claims:
        if (op, provider, dtype, prop) in refuted:
            continue
        grouped[(op, provider, prop)].add(dtype)
    lines += ["", "## Could claim (holds on every case checked, not declared)", ""]
    lines += [
        f"- {op} / {provider}: {prop} ({', '.join(sorted(dtypes))})"
        for (op, provider, prop), dtypes in sorted(grouped.items())
    ] or ["none"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jsonl")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    text = summarise(args.jsonl)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
