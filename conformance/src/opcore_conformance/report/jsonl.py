"""JSON Lines: one header record (``"type": "header"``), one record per case
(``"type": "case"``), one footer (``"type": "footer"``: counts by status, exit status, how
many cases were collected (null when the run stopped before collection ended), what
interrupted the run, if anything, and in which phase: ``stopped_in``).

The command line writes the file as it goes (`Stream`): each case's record is flushed when
the case ends, so a run stopped by a signal or a time limit still leaves its records. A file
without a footer is from a run that ended before it could write one."""

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


def footer(
    records: list[dict[str, Any]], *, collected: int | None = None, interrupted: str | None = None
) -> dict[str, Any]:
    """Counts by status and the exit status: 1 when a case is red or the run was
    interrupted before every collected case ran."""
    counts = collections.Counter(r["status"] for r in records)
    red = sum(counts[s] for s in S.RED)
    return {
        "type": "footer",
        "counts": {s: counts.get(s, 0) for s in S.ALL},
        "total": len(records),
        "collected": len(records) if collected is None else collected,
        "interrupted": interrupted,
        "exit_status": 1 if red or interrupted else 0,
    }


class Stream:
    """Writes the header now, each case record as it comes, the footer at `close`."""

    def __init__(self, path: Path, header: dict[str, Any]):
        self._f = open(path, "w", encoding="utf-8")  # noqa: SIM115  (closed by close())
        self._records: list[dict[str, Any]] = []
        self._line(header)

    def _line(self, rec: dict[str, Any]) -> None:
        self._f.write(json.dumps(_clean(rec), default=str, sort_keys=False) + "\n")
        self._f.flush()

    @property
    def records(self) -> list[dict[str, Any]]:
        return list(self._records)

    def add(self, record: dict[str, Any]) -> None:
        self._records.append(record)
        self._line(record)

    def close(
        self,
        *,
        collected: int | None,
        interrupted: str | None = None,
        stopped_in: str | None = None,
    ) -> dict[str, Any]:
        """Write the footer. ``collected`` None: the run stopped before collection ended.
        ``stopped_in``: the phase a signal stopped (``setup``, ``collection``, ``cases``)."""
        foot = footer(self._records, collected=collected, interrupted=interrupted)
        foot["collected"] = collected
        foot["stopped_in"] = stopped_in if interrupted else None
        self._line(foot)
        self._f.close()
        return foot


def write(
    path: Path,
    header: dict[str, Any],
    records: list[dict[str, Any]],
    *,
    collected: int | None = None,
    interrupted: str | None = None,
) -> None:
    """The whole file at once (the pytest plugin, at session end)."""
    foot = footer(records, collected=collected, interrupted=interrupted)
    foot["stopped_in"] = "cases" if interrupted else None
    with open(path, "w", encoding="utf-8") as f:
        for rec in [header, *records, foot]:
            f.write(json.dumps(_clean(rec), default=str, sort_keys=False) + "\n")


def read_footer(path: Path) -> dict[str, Any] | None:
    """The footer record, or None when the file has none (the run ended before writing it)."""
    last = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                last = line
    rec = json.loads(last) if last else None
    return rec if rec and rec.get("type") == "footer" else None


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
