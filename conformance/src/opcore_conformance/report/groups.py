"""Identical failures, grouped: one line, a count and one wildcard rerun for many cases.

Two red cases are identical when they have the same status, check and provider and their
messages differ only in numbers, the case's own sample name and dtype (the same defect
seen on other inputs). A group's glob is the ids' common beginning and end around one
``*``: ``--case GLOB`` reruns all of them (and any case between that matches too).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from typing import Any

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", re.IGNORECASE)


@dataclasses.dataclass
class Group:
    first: dict[str, Any]
    ids: list[str]

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def glob(self) -> str:
        return wildcard(self.ids)

    @property
    def repro(self) -> str | None:
        """The first case's rerun command, for the whole group."""
        repro = self.first.get("repro")
        if not repro or self.count == 1:
            return repro
        return repro.replace(
            f"--case {shlex.quote(self.first['id'])}", f"--case {shlex.quote(self.glob)}"
        )


def signature(rec: dict[str, Any]) -> tuple[str, ...]:
    message = rec.get("message") or ""
    for part in (rec.get("sample"), rec.get("dtype")):
        if part:
            message = message.replace(part, "<>")
    return (
        rec["status"],
        rec["check"],
        rec.get("op") or "",
        rec.get("provider") or "",
        _NUMBER.sub("#", message),
    )


def wildcard(ids: list[str]) -> str:
    """One glob over ``ids``: their common prefix, ``*``, their common suffix."""
    if len(set(ids)) == 1:
        return ids[0]
    prefix = os.path.commonprefix(ids)
    rests = [i[len(prefix) :] for i in ids]
    suffix = os.path.commonprefix([r[::-1] for r in rests])[::-1]
    return f"{prefix}*{suffix}"


def group_failures(records: list[dict[str, Any]]) -> list[Group]:
    """The records grouped by `signature`, in the order each group first appears."""
    groups: dict[tuple[str, ...], Group] = {}
    for rec in records:
        key = signature(rec)
        if key in groups:
            groups[key].ids.append(rec["id"])
        else:
            groups[key] = Group(rec, [rec["id"]])
    return list(groups.values())
