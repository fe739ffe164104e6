"""Failures a plugin author can act on, through a real run on a planted-defect plugin
(conftest's installed distributions): identical failures grouped with one wildcard rerun,
a checks column in the op table, xfailed cases left out of a row's worst err/tol, a near
name suggested for an expectations glob that matches nothing, and ``--draft-expectations``;
plus the wording and progress-weighting helpers those use."""

from __future__ import annotations

import re

import pytest

from opcore_conformance import expectations as X

EXPECTATIONS = """
version = 1

[[expect]]
match = "numerics[rms_norm-planted_eps-float32-eps_1e-2_kwargs]"
status = "xfail"
reason = "planted: epsilon outside the root"

[[expect]]
match = "numerics[rms_norm-planted_good-bf16-*]"
status = "skip"
reason = "a typo: bf16 is spelled bfloat16 in case ids"
"""


@pytest.fixture(scope="module")
def planted_run(planted_site, tmp_path_factory, run_suite, read_statuses):
    work = tmp_path_factory.mktemp("actionable")
    (work / "expect.toml").write_text(EXPECTATIONS)
    report_dir = work / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--ops",
            "rms_norm",
            "--providers",
            "planted_eps,planted_dtype,planted_good",
            "--dtypes",
            "float32,bfloat16",
            "--checks",
            "numerics",
            "--no-progress",
            "--expectations",
            str(work / "expect.toml"),
            "--draft-expectations",
            str(work / "draft.toml"),
        ],
        site=planted_site,
        report_dir=report_dir,
    )
    return proc, read_statuses(report_dir), work


def test_identical_failures_are_one_line_with_a_count_and_a_wildcard_rerun(planted_run):
    proc, records, _ = planted_run
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [r for r in records.values() if r["status"] == "fail"]
    assert len(failed) >= 3
    m = re.search(r"FAIL\s+(\d+) x (numerics\[rms_norm-planted_dtype-bfloat16-\S*)", proc.stdout)
    assert m, proc.stdout
    glob = m.group(2).rstrip(":")
    assert int(m.group(1)) >= 2
    assert f"--case '{glob}'" in proc.stdout  # the group's one rerun
    assert len(
        [i for i in records if X.compile_glob(glob).fullmatch(i) and records[i]["status"] == "fail"]
    ) == int(m.group(1))
    # fewer lines than failures: one per group
    assert proc.stdout.count("rerun:") < len(failed)


def test_op_table_has_a_checks_column_and_xfail_is_not_the_worst(planted_run):
    proc, records, work = planted_run
    assert "| op | provider | dtype | checks |" in (work / "reports" / "conformance.md").read_text()
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("op "))
    assert "checks" in header.split()
    row = next(
        line
        for line in lines
        if line.startswith("rms_norm") and "planted_eps" in line and "float32" in line
    )
    assert " numerics " in row
    [xfailed] = [r for r in records.values() if r["status"] == "xfail"]
    assert xfailed["provider"] == "planted_eps" and xfailed["max_ratio"] > 1
    others = [
        r["max_ratio"]
        for r in records.values()
        if r["provider"] == "planted_eps" and r["dtype"] == "float32" and r["status"] == "pass"
    ]
    # the row's worst err/tol is its worst passing case, not the xfailed one
    worst = float(row.split()[header.split().index("worst")])
    assert worst == pytest.approx(max(others), abs=0.006) and worst < 1, row


def test_unmatched_glob_suggests_the_near_name(planted_run):
    _, records, _ = planted_run
    [entry] = [r for r in records.values() if r["check"] == "expectations"]
    assert entry["status"] == "error"
    assert "did you mean 'numerics[rms_norm-planted_good-bfloat16-*]'" in entry["message"]


def test_draft_expectations_has_an_xfail_per_failure_group(planted_run):
    proc, records, work = planted_run
    draft = X.load(str(work / "draft.toml"))
    assert "drafted" in proc.stderr and "fill in each reason" in proc.stderr
    red = [i for i, r in records.items() if r["status"] in ("fail", "error")]
    assert draft.entries and all(
        e.status == "xfail" and e.reason.startswith("TODO") for e in draft.entries
    )
    for cid in red:  # every current failure is covered by a drafted entry
        assert draft.lookup(cid) is not None, cid


def test_wording_says_which_call_and_output():
    from opcore.layers import RMSNorm
    from opcore_conformance.wording import call_words, output_words

    assert output_words("out[1]") == "the 2nd returned tensor"
    assert output_words("out") == "the output"
    assert call_words(RMSNorm.forward_native, ("x", None)) == "the call forward(x, residual=None)"


def test_progress_is_weighted_by_expected_cost():
    import io

    from opcore_conformance.report.progress import Progress, expected_cost

    assert (
        expected_cost("compile.matches_eager")
        > expected_cost("opcheck")
        > expected_cost("numerics")
    )
    assert expected_cost("compile.fusion", "inductor") > expected_cost("compile.fusion", "eager")
    costs = [1.0] * 9 + [expected_cost("compile.dynamic_batch")]
    out = io.StringIO()
    p = Progress(len(costs), stream=out, weight=sum(costs))
    for c in costs[:9]:
        p.update("x", "pass", c)
    # nine of ten cases done, but the expensive compile case is still to come
    assert "[ 42%] 9/10" in out.getvalue().splitlines()[-1]


def test_opcheck_failure_carries_its_stack(planted_site, tmp_path, run_suite, read_statuses):
    report_dir = tmp_path / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--expectations",
            "none",
            "--no-progress",
            "--case",
            "opcheck[rms_norm-planted_dtype-bfloat16-*]",
        ],
        site=planted_site,
        report_dir=report_dir,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [r for r in read_statuses(report_dir).values() if r["status"] == "fail"]
    assert failed
    for rec in failed:
        stack = rec["details"]["traceback"]
        assert "Traceback (most recent call last)" in stack and "opcheck" in stack
