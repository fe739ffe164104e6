"""JUnit XML for CI front ends, generated from the JSONL records: one ``testsuite`` per
check, one ``testcase`` per case. fail and xpass are ``failure``, error is ``error``; skip,
unsupported, not_applicable and xfail are ``skipped`` with the status in the message.

An interrupted run (its footer names the signal) says so twice, for readers of either
kind: an ``interrupted`` attribute on ``testsuites``, and a suite ``run`` whose one case,
``incomplete``, is an ``error`` saying how far the run got, so a CI front end shows the run
red even when every case that ran passed."""

from __future__ import annotations

import collections
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from opcore_conformance import status as S
from opcore_conformance.report.markdown import incomplete_note


def build(
    header: dict[str, Any], records: list[dict[str, Any]], foot: dict[str, Any] | None = None
) -> ET.Element:
    """``foot``: the footer read back from the JSONL (None: none written)."""
    root = ET.Element("testsuites", name=f"opcore-conformance {header.get('platform')}")
    if foot is not None and foot.get("interrupted"):
        root.set("interrupted", str(foot["interrupted"]))
        suite = ET.SubElement(
            root, "testsuite", name="run", tests="1", failures="0", errors="1", skipped="0"
        )
        tc = ET.SubElement(
            suite, "testcase", classname="opcore.conformance.run", name="incomplete", time="0"
        )
        note = incomplete_note(foot, records)
        ET.SubElement(
            tc, "error", message=f"INCOMPLETE: {note}", type="interrupted"
        ).text = f"{note}; the cases below are those that ran"
    by_check: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for rec in records:
        by_check[rec["check"]].append(rec)
    for check, recs in by_check.items():
        suite = ET.SubElement(root, "testsuite", name=check, tests=str(len(recs)))
        counts: collections.Counter[str] = collections.Counter()
        for rec in recs:
            tc = ET.SubElement(
                suite,
                "testcase",
                classname=f"opcore.conformance.{check}",
                name=rec["id"],
                time=f"{rec.get('duration_s') or 0:.6f}",
            )
            status = rec["status"]
            message = rec.get("message") or ""
            if status in (S.FAIL, S.XPASS):
                counts["failures"] += 1
                el = ET.SubElement(tc, "failure", message=f"{status}: {message}", type=status)
                el.text = f"{message}\nrerun: {rec.get('repro')}"
            elif status == S.ERROR:
                counts["errors"] += 1
                el = ET.SubElement(tc, "error", message=message, type=status)
                el.text = f"{message}\nrerun: {rec.get('repro')}"
            elif status in (S.SKIP, S.UNSUPPORTED, S.NOT_APPLICABLE, S.XFAIL):
                counts["skipped"] += 1
                reason = rec.get("reason") or message
                ET.SubElement(tc, "skipped", message=f"{status}: {reason}", type=status)
        for key in ("failures", "errors", "skipped"):
            suite.set(key, str(counts[key]))
        props = ET.Element("properties")
        for key in ("platform", "device", "device_name", "mode", "seed"):
            ET.SubElement(props, "property", name=key, value=str(header.get(key)))
        suite.insert(0, props)
    return root


def write(
    path: Path,
    header: dict[str, Any],
    records: list[dict[str, Any]],
    foot: dict[str, Any] | None = None,
) -> None:
    tree = ET.ElementTree(build(header, records, foot))
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
