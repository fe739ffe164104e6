"""The report-directory rule (`opcore_conformance.report.dirs`): a run never replaces
another's reports unless told to. In-process on real directories; the command-line side
is in test_conformance_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from opcore_conformance.report import dirs


def test_default_runs_get_distinct_directories_even_in_the_same_second(tmp_path):
    base = tmp_path / "opcore-reports"
    claimed = [dirs.claim(None, base=base) for _ in range(3)]
    paths = [c.path for c in claimed]
    assert len(set(paths)) == 3 and all(p.parent == base and p.is_dir() for p in paths)
    assert all(c.per_run and c.created for c in claimed)


def test_latest_points_at_the_last_run_that_wrote_reports(tmp_path):
    base = tmp_path / "opcore-reports"
    first, second = dirs.claim(None, base=base), dirs.claim(None, base=base)
    assert dirs.mark_latest(first) == base / "latest"
    assert (base / "latest").resolve() == first.path.resolve()
    dirs.mark_latest(second)
    assert (base / "latest").resolve() == second.path.resolve()
    assert os.readlink(base / "latest") == second.path.name  # relative: the tree can move
    assert sorted(p.name for p in base.iterdir()) == sorted(
        [first.path.name, second.path.name, "latest"]
    )


def test_an_explicit_directory_is_used_as_is_and_refused_once_it_holds_a_report(tmp_path):
    target = tmp_path / "a" / "b"
    rd = dirs.claim(target)
    assert rd.path == target and rd.created and not rd.per_run and dirs.mark_latest(rd) is None
    (target / "conformance.md").write_text("earlier")
    with pytest.raises(
        dirs.ReportDirError, match=r"already holds the reports of an earlier run \(conformance.md\)"
    ):
        dirs.claim(target)
    assert dirs.claim(target, overwrite=True).created is False
    assert (target / "conformance.md").read_text() == "earlier"  # replaced by the run, not by claim


def test_release_removes_only_an_empty_directory_the_run_made(tmp_path):
    made = dirs.claim(tmp_path / "new")
    dirs.release(made)
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    dirs.release(dirs.claim(existing))
    assert existing.is_dir()  # the user's (empty) directory stays
    kept = dirs.claim(tmp_path / "kept")
    (kept.path / "conformance.jsonl").write_text("{}")
    dirs.release(kept)
    assert (kept.path / "conformance.jsonl").exists()


def test_a_default_base_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "opcore-reports").write_text("")
    with pytest.raises(
        dirs.ReportDirError, match="^the default report directory .* is not a directory$"
    ):
        dirs.claim(None, base=tmp_path / "opcore-reports")


def test_the_pytest_plugin_refuses_an_occupied_report_dir_before_collecting(tmp_path):
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    (report_dir / "conformance.jsonl").write_text("{}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--opcore-only",
            "--opcore-platform",
            "cpu",
            "--opcore-ops",
            "rms_norm",
            "--opcore-report-dir",
            str(report_dir),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (
        f"--opcore-report-dir {report_dir} already holds the reports of an earlier run"
        in proc.stderr
    )
    assert "pass --opcore-overwrite to replace them" in proc.stderr
    assert (report_dir / "conformance.jsonl").read_text() == "{}\n"
