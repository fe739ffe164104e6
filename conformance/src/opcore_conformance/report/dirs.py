"""Where a run's reports go, and the rule that no run silently replaces another's.

- No ``--report-dir``: each run writes a directory of its own, ``opcore-reports/<UTC time>``
  (``-2``, ``-3``, ... appended when two runs start in the same second), and
  ``opcore-reports/latest`` is pointed at it once its reports are written. Running the
  command twice, or on a fresh clone, just works and keeps both runs.
- ``--report-dir DIR``: the reports go exactly there (the path CI jobs and scripts collect),
  and a DIR that already holds a report is refused unless ``overwrite`` is given, in which
  case the run replaces those files (the derived ones are removed when it starts writing,
  so two runs' files are never mixed).

Nothing here imports torch: the directory is checked before the slow part of a run starts.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path

DEFAULT_BASE = Path("opcore-reports")
LATEST = "latest"
REPORT_NAMES = ("conformance.jsonl", "conformance.md", "conformance-junit.xml", "certificate.json")


class ReportDirError(ValueError):
    """The report directory cannot be used; the message is one line naming it."""


@dataclasses.dataclass
class ReportDir:
    """The directory a run writes to. ``per_run``: chosen by the run under the default base
    (its parent gets the ``latest`` link). ``created``: made by this run (removed again by
    `release` when the run ends without writing into it)."""

    path: Path
    per_run: bool
    created: bool


def existing_reports(path: Path) -> list[str]:
    """The report files already in ``path`` (its own level only)."""
    return [name for name in REPORT_NAMES if (path / name).exists()]


def claim(
    report_dir: Path | str | None,
    *,
    overwrite: bool = False,
    base: Path | str = DEFAULT_BASE,
    options: tuple[str, str] = ("--report-dir", "--overwrite"),
) -> ReportDir:
    """Make the directory this run writes to, or raise `ReportDirError`.

    ``report_dir`` None: a new directory under ``base`` named by the UTC start time.
    Otherwise that directory (created with its parents): refused when it already holds a
    report unless ``overwrite``. ``options``: the front end's names for the two options,
    used in messages (the pytest plugin's are ``--opcore-report-dir``, ``--opcore-overwrite``)."""
    if report_dir is None:
        base = Path(base)
        _make(base, f"the default report directory {base}")
        _check_writable(base, f"the default report directory {base}")
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for n in range(1, 1000):
            path = base / (stamp if n == 1 else f"{stamp}-{n}")
            try:
                path.mkdir()  # exist_ok=False: two runs starting together never share one
            except FileExistsError:
                continue
            except OSError as exc:
                raise ReportDirError(
                    f"cannot create the report directory {path}: {_why(exc)}"
                ) from None
            return ReportDir(path, per_run=True, created=True)
        raise ReportDirError(f"{base}: too many runs started in the second {stamp}")
    path = Path(report_dir)
    label = f"{options[0]} {path}"
    created = not path.exists()
    _make(path, label)
    _check_writable(path, label)
    held = existing_reports(path)
    if held and not overwrite:
        raise ReportDirError(
            f"{label} already holds the reports of an earlier run ({', '.join(held)}): pass "
            f"{options[1]} to replace them, or choose another directory (without {options[0]} "
            f"each run writes its own directory under {DEFAULT_BASE}/)"
        )
    return ReportDir(path, per_run=False, created=created)


def release(rd: ReportDir | None) -> None:
    """After a run that wrote nothing (it could not start): remove the directory it made."""
    if rd is None or not rd.created:
        return
    try:
        rd.path.rmdir()  # only when empty: never delete what someone else put there
    except OSError:
        pass


def mark_latest(rd: ReportDir) -> Path | None:
    """Point ``<base>/latest`` at a per-run directory (a relative symbolic link, replaced
    atomically). Best effort: where links cannot be made the printed paths still say
    where the reports are. Returns the link, or None when none was made."""
    if not rd.per_run:
        return None
    link = rd.path.parent / LATEST
    tmp = rd.path.parent / f".{LATEST}-{os.getpid()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(rd.path.name, target_is_directory=True)
        os.replace(tmp, link)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        return None
    return link


def _make(path: Path, label: str) -> None:
    if path.exists() and not path.is_dir():
        raise ReportDirError(f"{label} is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ReportDirError(
            f"{label}: a file is in the way (a part of the path is not a directory)"
        ) from None
    except OSError as exc:
        raise ReportDirError(f"{label}: cannot create it: {_why(exc)}") from None


def _check_writable(path: Path, label: str) -> None:
    # Write a file rather than ask os.access: that is the only answer that also holds for
    # read-only mounts, ACLs and full disks.
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".opcore-write-check-"):
            pass
    except OSError as exc:
        raise ReportDirError(f"{label} is not writable: {_why(exc)}") from None


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)
