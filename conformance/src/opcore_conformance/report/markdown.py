"""The Markdown summary, generated from the JSON Lines file only.

``python -m opcore_conformance.report.markdown run.jsonl`` prints it; the CLI and the pytest
plugin write it next to the JSONL after reading that file back, so the two never disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from opcore_conformance import status as S
from opcore_conformance.report.jsonl import as_float, footer, read, read_footer
from opcore_conformance.report.tables import check_rows, op_rows, ratio_text, red, ulp_text


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _counts_cells(counts) -> list[str]:
    return [str(counts.get(s, 0) or "") for s in S.ALL]


def incomplete_note(foot: dict[str, Any] | None, records: list[dict[str, Any]]) -> str | None:
    """Why the run is incomplete, from its footer (None: it ran every collected case)."""
    if foot is None:
        return (
            f"the report has no footer: the run ended after {len(records)} case(s) "
            "without finishing"
        )
    if foot.get("interrupted"):
        if foot.get("collected") is None:  # stopped in setup or collection: no case ran
            return (
                f"interrupted by {foot['interrupted']} during {foot.get('stopped_in') or 'setup'}, "
                f"before any case ran"
            )
        return (
            f"interrupted by {foot['interrupted']} after {foot['total']} of "
            f"{foot.get('collected')} collected case(s)"
        )
    return None


# The property checks (docs/properties.md), by the last part of their name, and the
# property each one measures.
PROPERTY_CHECKS = {
    "batch_invariance": "batch_invariant",
    "determinism": "deterministic",
    "capture_safety": "capture_safe",
}


def could_claim(records: list[dict[str, Any]]) -> list[tuple[tuple[str, str], list[str]]]:
    """``((op / provider, property), dtypes)`` where every case of that property's check
    passed with the property undeclared ("could claim")."""
    state: dict[tuple[str, str, str], bool] = {}
    for r in records:
        prop = PROPERTY_CHECKS.get((r.get("check") or "").rsplit(".", 1)[-1])
        if prop is None:
            continue
        key = (f"{r.get('op')} / {r.get('provider')}", prop, r.get("dtype") or "")
        claim = r.get("status") == "pass" and bool((r.get("details") or {}).get("could_claim"))
        state[key] = state.get(key, True) and claim
    out: dict[tuple[str, str], list[str]] = {}
    for (who, prop, dtype), ok in sorted(state.items()):
        if ok:
            out.setdefault((who, prop), []).append(dtype)
    return sorted(out.items())


def render(
    header: dict[str, Any], records: list[dict[str, Any]], written_footer: dict[str, Any] | None
) -> str:
    """The summary. ``written_footer`` is the footer read from the JSONL (`read_footer`;
    None when the file has none, i.e. the run did not finish)."""
    foot = footer(records)
    note = incomplete_note(written_footer, records)
    verdict = "INCOMPLETE" if note else ("FAILED" if foot["exit_status"] else "PASSED")
    v = header.get("versions", {})
    reference = header.get("reference", {})
    out = [
        f"# opcore conformance: {header.get('platform')} — {verdict}",
        "",
        f"- platform: `{header.get('platform')}` (`{header.get('platform_class')}`"
        f"{', ' + header['platform_distribution'] if header.get('platform_distribution') else ''})",
        f"- device: `{header.get('device')}` — {header.get('device_name')}",
        f"- versions: opcore {v.get('opcore')}, opcore-conformance {v.get('opcore-conformance')}, "
        f"torch {v.get('torch')}, triton {v.get('triton')}, python {v.get('python')}",
        f"- mode: {header.get('mode')}; sample seed: {header.get('seed')}; reference: "
        f"{reference.get('dtype')} on {reference.get('device')}",
        f"- expectations: {header.get('expectations') or 'none'}",
        f"- started: {header.get('started')}",
        f"- **incomplete**: {note}; the counts below cover the cases that ran" if note else None,
        "",
        "| " + " | ".join(S.ALL) + " | total |",
        "|" + "---:|" * (len(S.ALL) + 1),
        "| " + " | ".join(str(foot["counts"][s]) for s in S.ALL) + f" | {foot['total']} |",
        "",
    ]
    rows = op_rows(records)
    if rows:
        out += [
            "## Ops: op × provider × dtype",
            "",
            "Worst err/tol is the largest `|out - ref| / (atol + rtol·|ref|)` over the row's "
            "cases (1.00 is the bound). Peak ULP is the row's largest error in ULPs of the output "
            "dtype against the float64 reference, with native's on the same case and device in "
            "brackets (the error budget compares the two).",
            "",
            "| op | provider | dtype | checks | "
            + " | ".join(S.SYMBOL[s] + " " + s for s in S.ALL)
            + " | worst err/tol | peak ULP (native) | max abs | tolerance (atol, rtol) |",
            "|---|---|---|---|" + "---:|" * len(S.ALL) + "---:|---:|---:|---|",
        ]
        for row in rows:  # a table Row; ``r`` below is a record dict
            tol = f"{row.tolerance[0]:g}, {row.tolerance[1]:g}" if row.tolerance else ""
            out.append(
                "| "
                + " | ".join(
                    [
                        *row.key,
                        ", ".join(sorted(row.checks)),
                        *_counts_cells(row.counts),
                        ratio_text(row),
                        ulp_text(row),
                        "" if row.worst_abs is None else f"{row.worst_abs:.2e}",
                        tol,
                    ]
                )
                + " |"
            )
        out.append("")
    others = check_rows([r for r in records if not r.get("op")])
    if others:
        out += [
            "## Platform and other checks",
            "",
            "| check | " + " | ".join(S.ALL) + " |",
            "|---|" + "---:|" * len(S.ALL),
        ]
        for row in others:
            out.append("| " + " | ".join([row.key[0], *_counts_cells(row.counts)]) + " |")
        out.append("")
    bad = red(records)
    out += [f"## Needs attention ({len(bad)})", ""]
    if not bad:
        out += ["Nothing: no case failed, errored or passed unexpectedly.", ""]
    for r in bad:
        out += [
            f"- **{r['status']}** `{r['id']}`: {_cell(r.get('message') or '')}",
            f"  - rerun: `{r.get('repro')}`" if r.get("repro") else "",
        ]
    out.append("")
    claimable = could_claim(records)
    if claimable:
        out += [
            "## Properties that hold but are not declared (docs/properties.md)",
            "",
            "Every case of these checks passed; the provider could declare the property.",
            "",
            *(f"- {who}: `{prop}` ({', '.join(dtypes)})" for (who, prop), dtypes in claimable),
            "",
        ]
    loosened = [r for r in records if r.get("tolerance_source") == "expectations"]
    if loosened:
        out += [
            "## Loosened tolerances (from the expectations file)",
            "",
            "| case | atol | rtol | worst err/tol | status | reason |",
            "|---|---:|---:|---:|---|---|",
        ]
        for r in loosened:
            ratio = as_float(r.get("max_ratio"))
            out.append(
                f"| `{r['id']}` | {r.get('atol')} | {r.get('rtol')} | "
                f"{'' if ratio is None else f'{ratio:.2f}'} | {r['status']} | "
                f"{_cell(r.get('reason') or '')} |"
            )
        out.append("")
    expected = [r for r in records if r.get("expected") in ("xfail", "skip", "unsupported")]
    if expected:
        out += [
            "## Declared by the expectations file",
            "",
            "| case | declared | status | reason |",
            "|---|---|---|---|",
        ]
        for r in expected:
            out.append(
                f"| `{r['id']}` | {r['expected']} | {r['status']} | "
                f"{_cell(r.get('reason') or '')} |"
            )
        out.append("")
    return "\n".join(line for line in out if line is not None) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m opcore_conformance.report.markdown REPORT.jsonl", file=sys.stderr)
        return 2
    header, records = read(Path(argv[0]))
    sys.stdout.write(render(header, records, read_footer(Path(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
