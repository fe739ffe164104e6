"""An expectations file applied in a real run through the pytest plugin: xfail, an
unexpected pass, a skip, a loosened tolerance within the cap and one above it, and an entry
that matches nothing."""

from __future__ import annotations

import pytest

EXPECTATIONS = """
version = 1

[[expect]]
match = "numerics[rms_norm-planted_eps-float32-eps_1e-2_kwargs]"
status = "xfail"
reason = "epsilon is added outside the root"
error_regex = "exceed"

[[expect]]
match = "numerics[rms_norm-planted_good-float32-t1_h8]"
status = "xfail"
reason = "a stale entry: this case passes"

[[expect]]
match = "numerics[rms_norm-planted_eps-bfloat16-*]"
status = "tolerance"
reason = "far too loose"
atol = 1.0

[[expect]]
match = "numerics[rms_norm-planted_good-float32-t5_h7]"
status = "skip"
reason = "skipped on purpose"

[[expect]]
match = "numerics[rms_norm-planted_good-float32-t5_h3?]"
status = "tolerance"
reason = "twice the op's rtol"
rtol = 2.6e-6

[[expect]]
match = "numerics[no_such_op-*]"
status = "xfail"
reason = "matches nothing"
"""


@pytest.fixture(scope="module")
def expectations_run(planted_site, tmp_path_factory, run_suite, read_statuses):
    base = tmp_path_factory.mktemp("expectations")
    path = base / "expectations.toml"
    path.write_text(EXPECTATIONS)
    report_dir = base / "reports"
    proc = run_suite(
        [
            "-p",
            "no:cacheprovider",
            "-q",
            "--opcore-only",
            "--opcore-platform",
            "cpu",
            "--opcore-ops",
            "rms_norm",
            "--opcore-providers",
            "planted_eps,planted_good",
            "--opcore-dtypes",
            "float32,bfloat16",
            "--opcore-checks",
            "numerics",
            "--opcore-expectations",
            str(path),
            "--opcore-report-dir",
            str(report_dir),
        ],
        site=planted_site,
        report_dir=report_dir,
        module="pytest",
    )
    return proc, read_statuses(report_dir), report_dir


def test_expected_failure_is_xfail(expectations_run):
    _, records, _ = expectations_run
    rec = records["numerics[rms_norm-planted_eps-float32-eps_1e-2_kwargs]"]
    assert (rec["status"], rec["raw_status"], rec["expected"]) == ("xfail", "fail", "xfail")
    assert rec["reason"] == "epsilon is added outside the root"


def test_unexpected_pass_is_xpass_and_fails_the_run(expectations_run):
    proc, records, _ = expectations_run
    rec = records["numerics[rms_norm-planted_good-float32-t1_h8]"]
    assert rec["status"] == "xpass" and "remove the entry" in rec["message"]
    assert proc.returncode == 1
    assert "numerics[rms_norm-planted_good-float32-t1_h8]" in proc.stdout


def test_entry_matching_nothing_is_an_error(expectations_run):
    _, records, _ = expectations_run
    rec = records["expectations[entry6]"]
    assert rec["status"] == "error" and "matches no case" in rec["message"]


def test_tolerance_above_the_cap_is_an_error(expectations_run):
    _, records, _ = expectations_run
    rec = records["numerics[rms_norm-planted_eps-bfloat16-t1_h8]"]
    assert rec["status"] == "error" and "above the cap" in rec["message"]


def test_tolerance_within_the_cap_is_used_and_reported(expectations_run):
    _, records, report_dir = expectations_run
    rec = records["numerics[rms_norm-planted_good-float32-t5_h31]"]
    assert rec["status"] == "pass" and rec["tolerance_source"] == "expectations"
    assert rec["rtol"] == pytest.approx(2.6e-6)
    assert records["numerics[rms_norm-planted_good-float32-t5_h7]"]["status"] == "skip"
    md = (report_dir / "conformance.md").read_text()
    assert "Loosened tolerances" in md and "t5_h31" in md
