"""Reports of a conformance run. The JSON Lines file is the primary record; the Markdown
summary, the JUnit XML and certificate.json are generated from it (`write_all`), the
terminal table from the same records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opcore_conformance.report import certificate, jsonl, junit, markdown

JSONL_NAME = "conformance.jsonl"
MARKDOWN_NAME = "conformance.md"
JUNIT_NAME = "conformance-junit.xml"
CERTIFICATE_NAME = "certificate.json"


def paths_in(report_dir: Path) -> dict[str, Path]:
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    return {
        "jsonl": report_dir / JSONL_NAME,
        "markdown": report_dir / MARKDOWN_NAME,
        "junit": report_dir / JUNIT_NAME,
        "certificate": report_dir / CERTIFICATE_NAME,
    }


def write_all(
    report_dir: Path,
    header: dict[str, Any],
    records: list[dict[str, Any]],
    *,
    collected: int | None = None,
    interrupted: str | None = None,
) -> dict[str, Path]:
    """Write the JSONL, then derive the Markdown and JUnit files from what was written.
    ``interrupted`` (a signal's name) with ``collected`` marks a run stopped early."""
    paths = paths_in(report_dir)
    jsonl.write(paths["jsonl"], header, records, collected=collected, interrupted=interrupted)
    derive(paths)
    return paths


def open_stream(report_dir: Path, header: dict[str, Any]) -> tuple[jsonl.Stream, dict[str, Path]]:
    """Start the JSONL now (header first; records are added as cases end); call `derive`
    once the stream is closed."""
    paths = paths_in(report_dir)
    # The Markdown and JUnit files exist only next to the JSONL they were derived from: an
    # earlier run's (replaced with --overwrite) go now, not when this run ends, which a
    # killed run never reaches.
    paths["markdown"].unlink(missing_ok=True)
    paths["junit"].unlink(missing_ok=True)
    paths["certificate"].unlink(missing_ok=True)
    return jsonl.Stream(paths["jsonl"], header), paths


def derive(paths: dict[str, Path]) -> None:
    """The Markdown summary, the JUnit XML and certificate.json, from the JSONL file as
    written."""
    header_back, records_back = jsonl.read(paths["jsonl"])
    foot = jsonl.read_footer(paths["jsonl"])
    paths["markdown"].write_text(markdown.render(header_back, records_back, foot), encoding="utf-8")
    junit.write(paths["junit"], header_back, records_back, foot)
    cert = certificate.build(header_back, records_back, foot)
    paths["certificate"].write_text(
        json.dumps(cert, indent=2, default=str) + "\n", encoding="utf-8"
    )
