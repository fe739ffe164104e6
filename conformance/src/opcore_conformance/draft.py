"""``--draft-expectations FILE``: an expectations file drafted from a run's failures.

One ``xfail`` entry per group of identical failures (`report.groups`: the same defect on
other samples shares one glob), each with the message it failed with as a comment and a
``reason`` left for the author to fill in: the suite cannot know why a case fails, and an
entry without a real reason hides a defect. xpass cases get no entry (the fix there is to
remove the stale entry, which the message says).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opcore_conformance import status as S
from opcore_conformance.report.groups import group_failures

REASON_TODO = "TODO: why this fails here, and the issue tracking it"


def render(records: list[dict[str, Any]], *, platform: str | None, mode: str | None) -> str:
    failures = [r for r in records if r["status"] in (S.FAIL, S.ERROR)]
    lines = [
        f"# Drafted by opcore conformance from a {mode} run on platform {platform}:",
        f"# {len(failures)} failing case(s). Fill in every reason (or fix the defect and drop",
        "# the entry) before shipping this as the platform's conformance_expectations.",
        "version = 1",
        "",
    ]
    for g in group_failures(failures):
        message = " ".join((g.first.get("message") or "").split())
        lines += [
            f"# {g.count} case(s), e.g. {g.first['id']}: {g.first['status']}: {message[:300]}",
            "[[expect]]",
            f"match = {json.dumps(g.glob)}",
            'status = "xfail"',
            f"reason = {json.dumps(REASON_TODO)}",
            "",
        ]
    return "\n".join(lines)


def target_problem(path: Path | str, *, overwrite: bool) -> str | None:
    """Why ``path`` cannot take a draft, checked before the run (so that a long run does not
    end in a refusal): an existing file is kept unless ``overwrite`` (like ``--report-dir``'s
    reports), a directory is never replaced, and the file's folder must exist. ``None``
    when it can."""
    path = Path(path)
    if path.is_dir():
        return f"--draft-expectations {path}: is a directory; name the file to write"
    if path.exists() or path.is_symlink():
        if overwrite:
            return None
        return (
            f"--draft-expectations {path}: the file already exists: pass --overwrite to "
            f"replace it, or choose another file"
        )
    if not path.absolute().parent.is_dir():
        return f"--draft-expectations {path}: its folder {path.absolute().parent} does not exist"
    return None


def write(
    path: Path | str, records: list[dict[str, Any]], *, platform: str | None, mode: str | None
) -> int:
    """Write the draft; return how many entries it has."""
    text = render(records, platform=platform, mode=mode)
    Path(path).write_text(text, encoding="utf-8")
    return text.count("[[expect]]")
