"""The terminal summary: op x provider x dtype counts with the worst error against its
tolerance, the other checks' counts, then every red case with its repro command."""

from __future__ import annotations

from typing import Any

from opcore_conformance import status as S
from opcore_conformance.report.groups import group_failures
from opcore_conformance.report.tables import (
    check_rows,
    checks_text,
    counts_text,
    op_rows,
    ratio_text,
    red,
    ulp_text,
)

MAX_LISTED = 25
COLUMNS = (S.PASS, S.FAIL, S.XFAIL, S.XPASS, S.ERROR, S.SKIP, S.UNSUPPORTED, S.NOT_APPLICABLE)
SHORT = {
    S.PASS: "pass",
    S.FAIL: "fail",
    S.XFAIL: "xfail",
    S.XPASS: "xpass",
    S.ERROR: "err",
    S.SKIP: "skip",
    S.UNSUPPORTED: "unsup",
    S.NOT_APPLICABLE: "n/a",
}


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append(
            "  ".join(
                c.ljust(w) if i < 4 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=False))
            )
        )
    return out


def render(
    header: dict[str, Any],
    records: list[dict[str, Any]],
    paths: dict[str, Any] | None = None,
    incomplete: str | None = None,
) -> str:
    lines = [
        f"opcore conformance: platform {header.get('platform')} on {header.get('device')} "
        f"({header.get('device_name')}), {header.get('mode')} mode",
    ]
    rows = op_rows(records)
    if rows:
        table = [
            [
                *r.key,
                checks_text(r),
                *(str(r.counts.get(s, 0) or ".") for s in COLUMNS),
                ratio_text(r),
                ulp_text(r),
                "-" if r.worst_abs is None else f"{r.worst_abs:.2e}",
            ]
            for r in rows
        ]
        lines += [""] + _table(
            [
                "op",
                "provider",
                "dtype",
                "checks",
                *(SHORT[s] for s in COLUMNS),
                "worst err/tol",
                "peak ULP (native)",
                "max abs",
            ],
            table,
        )
    others = [r for r in check_rows([x for x in records if not x.get("op")])]
    if others:
        table = [[r.key[0], counts_text(r.counts)] for r in others]
        lines += [""] + _table(["check", "results"], table)
    bad = red(records)
    total = {s: sum(1 for r in records if r["status"] == s) for s in S.ALL}
    lines += ["", "total: " + ", ".join(f"{n} {s}" for s, n in total.items() if n)]
    if incomplete:
        lines += [f"INCOMPLETE: {incomplete}"]
    if bad:
        groups = group_failures(bad)
        lines += [
            "",
            f"{len(bad)} case(s) need attention (fail, error or xpass)"
            + (
                f", in {len(groups)} group(s) of identical failures:"
                if len(groups) < len(bad)
                else ":"
            ),
        ]
        for g in groups[:MAX_LISTED]:
            r = g.first
            if g.count == 1:
                lines.append(f"  {r['status'].upper():5} {r['id']}: {r.get('message') or ''}")
            else:
                lines.append(
                    f"  {r['status'].upper():5} {g.count} x {g.glob}: {r.get('message') or ''} "
                    f"(first: {r['id']})"
                )
            if g.repro:
                lines.append(f"        rerun: {g.repro}")
        if len(groups) > MAX_LISTED:
            lines.append(
                f"  ... and {len(groups) - MAX_LISTED} more group(s): every case is in the "
                f"Markdown summary and the JSONL, with its rerun command"
            )
    if paths:
        lines += [""] + [f"{k}: {v}" for k, v in paths.items()]
    return "\n".join(lines)
