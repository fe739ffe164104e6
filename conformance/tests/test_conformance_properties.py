"""The property checks (docs/properties.md) catch planted defects: a provider declaring
``batch_invariant`` that picks its block size from the row count fails
``batch_invariance``; one declaring ``capture_safe`` that calls ``.item()`` gets
``not_applicable`` from ``capture_safety`` on the CPU (no graphs; the H200 run in
bench/gpu/properties.sh covers the failing case). The providers are real registrations
(`planted_properties.py`), run by the real suite in a fresh interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def records(tmp_path_factory, run_suite, read_statuses):
    report_dir = tmp_path_factory.mktemp("properties") / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--import",
            "planted_properties",
            "--ops",
            "rms_norm",
            "--providers",
            "planted_rowblock,planted_item,native",
            "--dtypes",
            "float32",
            "--checks",
            "batch_invariance,capture_safety,determinism",
            "--expectations",
            "none",
            "--no-progress",
        ],
        site=HERE,
        report_dir=report_dir,
    )
    return proc, read_statuses(report_dir), report_dir


def _case(records, check, provider):
    (found,) = [r for r in records.values() if r["check"] == check and r["provider"] == provider]
    return found


def test_batch_invariance_fails_a_provider_whose_blocking_follows_the_rows(records):
    proc, recs, _ = records
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = _case(recs, "batch_invariance", "planted_rowblock")
    assert r["status"] == "fail"
    assert "declares batch_invariant" in r["message"]
    assert "differ from the row computed alone" in r["message"]


def test_capture_safety_is_not_applicable_without_graphs(records):
    _, recs, _ = records
    r = _case(recs, "capture_safety", "planted_item")
    assert r["status"] == "not_applicable"
    assert "has no graphs" in r["message"]


def test_undeclared_property_that_holds_is_reported_as_claimable(records):
    _, recs, report_dir = records
    r = _case(recs, "batch_invariance", "planted_item")
    assert r["status"] == "pass"
    assert "could claim" in r["message"]
    assert r["details"]["could_claim"] == "batch_invariant"
    report = (report_dir / "conformance.md").read_text()
    section = report.split("## Properties that hold but are not declared", 1)[1]
    assert "- rms_norm / planted_item: `batch_invariant` (float32)" in section
    assert "planted_rowblock" not in section.split("##", 1)[0]


def test_native_declared_properties_hold_on_the_cpu(records):
    """The cpu plugin's declaration for native rms_norm (batch_invariant, deterministic),
    checked: declared and holding is a plain pass."""
    _, recs, _ = records
    r = _case(recs, "batch_invariance", "native")
    assert r["status"] == "pass" and r["details"]["declared"] is True
    det = [x for x in recs.values() if x["check"] == "determinism" and x["provider"] == "native"]
    assert det and all(x["status"] == "pass" and x["details"]["declared"] for x in det)


def test_attention_property_checks_on_the_cpu(tmp_path, run_suite, read_statuses):
    """TORCH_NATIVE (the cpu platform's candidate) declares batch_invariant and
    deterministic: both checked and holding on decode batches and on mixed ones (decode
    rows, whole prompts and chunks over a prefix together); capture is n/a."""
    report_dir = tmp_path / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--checks",
            "attention.batch_invariance,attention.determinism,attention.capture_safety",
            "--expectations",
            "none",
            "--no-progress",
        ],
        site=HERE,
        report_dir=report_dir,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    recs = read_statuses(report_dir)
    got = {(r["check"], r["provider"], r["sample"]): r for r in recs.values()}
    for sample in ("default", "default-mixed"):
        for check in ("attention.batch_invariance", "attention.determinism"):
            r = got[(check, "TORCH_NATIVE", sample)]
            assert r["status"] == "pass" and r["details"]["declared"] is True, r
        r = got[("attention.capture_safety", "TORCH_NATIVE", sample)]
        assert r["status"] == "not_applicable"
    mixed = got[("attention.batch_invariance", "TORCH_NATIVE", "default-mixed")]
    assert mixed["id"] == "attention.batch_invariance[TORCH_NATIVE-default-bfloat16-mixed]"
    assert mixed["details"]["sequences_checked"] == 6  # 3 probes in batches of 3 and 9
