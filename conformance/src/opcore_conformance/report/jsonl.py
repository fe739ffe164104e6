"""JSON Lines: one header record (``"type": "header"``), one record per case
(``"type": "case"``), one footer (``"type": "footer"``: counts by status, exit status)."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any

from opcore_conformance import status as S


def _clean(value: Any) -> Any:
    # JSON has no inf/nan: write them as strings so every reader parses the file.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def footer(records: list[dict[str, Any]]) -> dict[str, Any]:
    counts = collections.Counter(r["status"] for r in records)
    red = sum(counts[s] for s in S.RED)
    return {"type": "footer", "counts": {s: counts.get(s, 0) for s in S.ALL},
            "total": len(records), "exit_status": 1 if red else 0}


def write(path: Path, header: dict[str, Any], records: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for rec in [header, *records, footer(records)]:
            f.write(json.dumps(_clean(rec), default=str, sort_keys=False) + "\n")


def read(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    header: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("type") == "header":
                header = rec
            elif rec.get("type") == "case":
                records.append(rec)
    return header, records


def as_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
