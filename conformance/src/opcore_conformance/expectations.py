"""The expectations file: what a platform declares about its own conformance run.

One TOML file per platform, pointed to by ``--expectations FILE`` (or
``--opcore-expectations``), else by the platform class attribute
``conformance_expectations = "package:relative/path.toml"`` (a package resource, so it
works from an installed wheel). Format::

    version = 1

    [[expect]]
    match = "numerics[rms_norm-triton-bfloat16-*]"   # glob over case ids
    status = "tolerance"                             # xfail | skip | unsupported | tolerance
    reason = "accumulates in bf16 (kernel issue #12)" # required, non-empty
    atol = 2e-2                                      # tolerance only: loosened bound,
    rtol = 2e-2                                      #   capped (see TOLERANCE_CAP)

    [[expect]]
    match = "opcheck[rotary_embedding-*]"
    status = "xfail"
    reason = "fake impl returns the wrong stride"
    error_regex = "stride"                           # xfail only, optional: the failure
                                                     #   message must match, else it stays fail

Globs: ``*`` matches any run of characters, ``?`` one character; everything else,
brackets included, is literal (case ids contain ``[`` and ``]``).

Rules: every entry must match at least one case of this platform's whole inventory
(quick and full, all filters off), counting only the cases no earlier entry already took
(the first matching entry wins); an entry that matches nothing is an ``error`` case of its
own. A case matched by ``xfail`` that passes is ``xpass`` and fails the run.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.resources
import math
import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from opcore_conformance import status as S
from opcore_conformance.case import Tolerance

SCHEMA_VERSION = 1
ENTRY_STATUSES = ("xfail", "skip", "unsupported", "tolerance")
_KEYS = {"match", "status", "reason", "atol", "rtol", "error_regex", "link"}

# A loosened tolerance may be at most this many times the op's own tolerance for the dtype:
# beyond it the kernel is not computing the op any more, and an xfail is the honest entry.
TOLERANCE_CAP = {"float32": 10.0, "float64": 10.0, "float16": 4.0, "bfloat16": 4.0}
DEFAULT_CAP = 4.0


class ExpectationsError(ValueError):
    """A malformed expectations file; the message names the file and the entry."""


@dataclasses.dataclass
class Entry:
    index: int  # 1-based position in the file
    match: str
    status: str
    reason: str
    atol: float | None = None
    rtol: float | None = None
    error_regex: str | None = None
    link: str | None = None
    pattern: re.Pattern[str] = dataclasses.field(init=False, repr=False)  # from ``match``

    def __post_init__(self) -> None:
        self.pattern = compile_glob(self.match)

    def matches(self, cid: str) -> bool:
        return self.pattern.fullmatch(cid) is not None

    def label(self) -> str:
        return f"entry #{self.index} (match = {self.match!r})"


@dataclasses.dataclass
class Expectations:
    source: str | None
    entries: list[Entry]

    def lookup(self, cid: str) -> Entry | None:
        """The first entry matching case ``cid``."""
        for entry in self.entries:
            if entry.matches(cid):
                return entry
        return None

    def unmatched(self, inventory: list[str]) -> list[Entry]:
        """Entries that take no id of ``inventory`` (first match wins)."""
        used: set[int] = set()
        for cid in inventory:
            entry = self.lookup(cid)
            if entry is not None:
                used.add(entry.index)
        return [e for e in self.entries if e.index not in used]


def compile_glob(glob: str) -> re.Pattern[str]:
    """``*`` -> any run, ``?`` -> one character, everything else literal."""
    out = []
    for ch in glob:
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def empty() -> Expectations:
    return Expectations(source=None, entries=[])


def parse(text: str, source: str = "<string>") -> Expectations:
    """Parse and validate expectations TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(data) - {"version", "expect"}
    if unknown:
        raise ExpectationsError(
            f"{source}: unknown top-level key(s) {sorted(unknown)}; expected 'version' and "
            f"[[expect]] tables"
        )
    version = data.get("version")
    if version != SCHEMA_VERSION:
        raise ExpectationsError(
            f"{source}: 'version = {SCHEMA_VERSION}' is required (got {version!r})"
        )
    raw_entries = data.get("expect", [])
    if not isinstance(raw_entries, list):
        raise ExpectationsError(f"{source}: 'expect' must be an array of tables ([[expect]])")
    entries = [_entry(raw, i, source) for i, raw in enumerate(raw_entries, start=1)]
    return Expectations(source=source, entries=entries)


def _entry(raw: Any, index: int, source: str) -> Entry:
    where = f"{source}: [[expect]] #{index}"
    if not isinstance(raw, dict):
        raise ExpectationsError(f"{where}: must be a table")
    unknown = set(raw) - _KEYS
    if unknown:
        raise ExpectationsError(
            f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}"
        )
    match = raw.get("match")
    if not isinstance(match, str) or not match.strip():
        raise ExpectationsError(f"{where}: 'match' must be a non-empty glob over case ids")
    where = f"{where} (match = {match!r})"
    status = raw.get("status")
    if status not in ENTRY_STATUSES:
        raise ExpectationsError(
            f"{where}: 'status' must be one of {', '.join(ENTRY_STATUSES)}; got {status!r}"
        )
    reason = raw.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise ExpectationsError(f"{where}: 'reason' is required and must say why")
    atol, rtol = raw.get("atol"), raw.get("rtol")
    if status == "tolerance":
        if atol is None and rtol is None:
            raise ExpectationsError(f"{where}: status 'tolerance' needs 'atol' and/or 'rtol'")
        for key, value in (("atol", atol), ("rtol", rtol)):
            if value is not None and (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ExpectationsError(
                    f"{where}: '{key}' must be a finite number >= 0; got {value!r}"
                )
    elif atol is not None or rtol is not None:
        raise ExpectationsError(f"{where}: 'atol'/'rtol' are only allowed with status 'tolerance'")
    error_regex = raw.get("error_regex")
    if error_regex is not None:
        if status != "xfail":
            raise ExpectationsError(f"{where}: 'error_regex' is only allowed with status 'xfail'")
        try:
            re.compile(error_regex)
        except re.error as exc:
            raise ExpectationsError(
                f"{where}: 'error_regex' is not a regular expression: {exc}"
            ) from None
    link = raw.get("link")
    return Entry(
        index=index,
        match=match,
        status=status,
        reason=reason.strip(),
        atol=None if atol is None else float(atol),
        rtol=None if rtol is None else float(rtol),
        error_regex=error_regex,
        link=link,
    )


def load(path: str | Path) -> Expectations:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ExpectationsError(f"expectations file {path}: cannot read it: {exc}") from None
    return parse(text, str(path))


def load_resource(spec: str) -> Expectations:
    """Load ``"package:relative/path.toml"`` through importlib.resources."""
    package, sep, rel = spec.partition(":")
    if not sep or not package or not rel:
        raise ExpectationsError(
            f"conformance_expectations = {spec!r}: expected 'package:relative/path.toml'"
        )
    try:
        importlib.import_module(package)
        resource = importlib.resources.files(package).joinpath(rel)
        text = resource.read_text(encoding="utf-8")
    except (ImportError, OSError) as exc:
        raise ExpectationsError(
            f"conformance_expectations = {spec!r}: cannot read it: {exc}"
        ) from None
    return parse(text, spec)


def loosened(entry: Entry, default: Tolerance, dtype: str | None) -> Tolerance:
    """The tolerance an entry sets for a case whose op tolerance is ``default``; raises
    `ExpectationsError` when it exceeds the cap for ``dtype``."""
    cap = TOLERANCE_CAP.get(dtype or "", DEFAULT_CAP)
    atol = default.atol if entry.atol is None else entry.atol
    rtol = default.rtol if entry.rtol is None else entry.rtol
    for key, value, base in (("atol", atol, default.atol), ("rtol", rtol, default.rtol)):
        limit = cap * base
        if value > limit * (1 + 1e-12):
            raise ExpectationsError(
                f"{entry.label()} sets {key} = {value:g}, above the cap {cap:g} x {base:g} = "
                f"{limit:g} for {dtype}: a kernel that needs more is not computing the op; "
                f"declare it 'xfail' with the reason instead"
            )
    return Tolerance(atol=max(atol, default.atol), rtol=max(rtol, default.rtol))


def resolve_outcome(raw_status: str, entry: Entry | None, message: str) -> str:
    """The final status of a case that ran, given the entry that matched it."""
    if entry is None or entry.status == "tolerance":
        return raw_status
    if entry.status == "xfail":
        if raw_status == S.PASS:
            return S.XPASS
        if raw_status in (S.FAIL, S.ERROR):
            if entry.error_regex and not re.search(entry.error_regex, message or ""):
                return raw_status
            return S.XFAIL
    return raw_status
