"""Aggregations shared by the terminal table and the Markdown summary."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from opcore_conformance import status as S
from opcore_conformance.report.jsonl import as_float


@dataclasses.dataclass
class Row:
    key: tuple[str, ...]
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    worst_ratio: float | None = None
    worst_abs: float | None = None
    worst_id: str | None = None
    tolerance: tuple[float, float] | None = None
    # the row's largest peak error in ULPs (numerics), and native's on that same case
    peak_ulp: float | None = None
    native_peak_ulp: float | None = None

    checks: set = dataclasses.field(default_factory=set)

    def add(self, rec: dict[str, Any]) -> None:
        self.counts[rec["status"]] += 1
        self.checks.add(rec["check"])
        if rec["status"] == S.XFAIL:
            return  # expected to fail: counted, but its error is not the row's worst
        details = rec.get("details") or {}
        peak = as_float(details.get("peak_ulp"))
        if peak is not None and (self.peak_ulp is None or peak > self.peak_ulp):
            self.peak_ulp = peak
            self.native_peak_ulp = as_float(details.get("native_peak_ulp"))
        ratio = as_float(rec.get("max_ratio"))
        if ratio is not None and (self.worst_ratio is None or ratio > self.worst_ratio):
            self.worst_ratio = ratio
            self.worst_abs = as_float(rec.get("max_abs"))
            self.worst_id = rec["id"]
            if rec.get("atol") is not None:
                self.tolerance = (rec["atol"], rec["rtol"])


def op_rows(records: list[dict[str, Any]]) -> list[Row]:
    """op x provider x dtype over every per-op check (worst error from numerics/attention)."""
    rows: dict[tuple[str, ...], Row] = {}
    for rec in records:
        if not rec.get("op"):
            continue
        provider = rec.get("provider") or ("(layer)" if rec["check"].startswith("layers") else "")
        key = (rec["op"], provider, rec.get("dtype") or "")
        rows.setdefault(key, Row(key)).add(rec)
    return [rows[k] for k in sorted(rows)]


def check_rows(records: list[dict[str, Any]]) -> list[Row]:
    rows: dict[tuple[str, ...], Row] = {}
    for rec in records:
        key = (rec["check"],)
        rows.setdefault(key, Row(key)).add(rec)
    return list(rows.values())


def checks_text(row: Row) -> str:
    """The row's checks: one name, or the first per-op check and how many more (``numerics
    +5``), so a row of compile.lowering or layers.binding cases says so."""
    names = sorted(row.checks, key=lambda c: (c != "numerics", c))
    return names[0] if len(names) == 1 else f"{names[0]} +{len(names) - 1}"


def counts_text(counts: collections.Counter) -> str:
    return ", ".join(f"{counts[s]} {s}" for s in S.ALL if counts.get(s))


def ratio_text(row: Row) -> str:
    if row.worst_ratio is None:
        return "-"
    return f"{row.worst_ratio:.2f}"


def ulp_text(row: Row) -> str:
    """``"1.39 (0.50)"``: the row's worst peak ULP error and native's on that case."""
    if row.peak_ulp is None:
        return "-"
    native = "-" if row.native_peak_ulp is None else f"{row.native_peak_ulp:.2f}"
    return f"{row.peak_ulp:.2f} ({native})"


def red(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["status"] in S.RED]
