"""In-process tests of the expectations file, glob matching, status resolution, the
comparison, and the reports generated from JSONL."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest
import torch

from opcore_conformance import expectations as X
from opcore_conformance import status as S
from opcore_conformance.case import Tolerance
from opcore_conformance.report import write_all
from opcore_conformance.report.jsonl import read, read_footer
from opcore_conformance.report.markdown import render
from opcore_conformance.tensors import compare, to_device


def entry_text(**kw) -> str:
    body = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in kw.items())
    return f"version = 1\n[[expect]]\n{body}\n"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"match": "a*", "status": "xfail"}, "'reason' is required"),
        ({"match": "a*", "status": "xfail", "reason": "  "}, "'reason' is required"),
        ({"match": "a*", "status": "broken", "reason": "r"}, "'status' must be one of"),
        ({"match": "a*", "status": "xfail", "reason": "r", "atol": 0.1}, "only allowed with status 'tolerance'"),
        ({"match": "a*", "status": "tolerance", "reason": "r"}, "needs 'atol' and/or 'rtol'"),
        ({"match": "a*", "status": "tolerance", "reason": "r", "rtol": -1.0}, "finite number >= 0"),
        ({"match": "a*", "status": "skip", "reason": "r", "colour": "red"}, "unknown key"),
        ({"match": "a*", "status": "skip", "reason": "r", "error_regex": "x"}, "only allowed with status 'xfail'"),
    ],
)
def test_malformed_entries_are_rejected_with_the_entry_named(fields, message):
    with pytest.raises(X.ExpectationsError, match=message) as info:
        X.parse(entry_text(**fields), "plugin.toml")
    assert "plugin.toml: [[expect]] #1" in str(info.value)


def test_version_is_required():
    with pytest.raises(X.ExpectationsError, match="'version = 1' is required"):
        X.parse('[[expect]]\nmatch = "a"\nstatus = "skip"\nreason = "r"\n')


def test_globs_treat_brackets_literally():
    e = X.parse(entry_text(match="numerics[rms_norm-*-bfloat16-t?_h8]", status="skip", reason="r")).entries[0]
    assert e.matches("numerics[rms_norm-triton-bfloat16-t1_h8]")
    assert not e.matches("numerics[rms_norm-triton-float16-t1_h8]")
    assert not e.matches("numerics[rms_norm-triton-bfloat16-t1_h8]x")
    assert not X.compile_glob("numerics[ab]").fullmatch("numericsa")


def test_first_matching_entry_wins_and_shadowed_entries_are_unmatched():
    exp = X.parse(
        'version = 1\n'
        '[[expect]]\nmatch = "numerics[*]"\nstatus = "skip"\nreason = "all"\n'
        '[[expect]]\nmatch = "numerics[rms_norm-*]"\nstatus = "xfail"\nreason = "shadowed"\n'
    )
    assert exp.lookup("numerics[rms_norm-native-float32-a]").index == 1
    assert [e.index for e in exp.unmatched(["numerics[rms_norm-native-float32-a]"])] == [2]


def test_status_resolution():
    xfail = X.parse(entry_text(match="a", status="xfail", reason="r", error_regex="exceed")).entries[0]
    assert X.resolve_outcome(S.PASS, xfail, "") == S.XPASS
    assert X.resolve_outcome(S.FAIL, xfail, "3 elements exceed atol") == S.XFAIL
    assert X.resolve_outcome(S.FAIL, xfail, "raised RuntimeError") == S.FAIL  # another failure
    assert X.resolve_outcome(S.FAIL, None, "") == S.FAIL
    assert S.is_red(S.XPASS) and S.is_red(S.ERROR) and not S.is_red(S.XFAIL)


def test_loosened_tolerance_is_capped_per_dtype():
    e = X.parse(entry_text(match="a", status="tolerance", reason="r", rtol=1e-5)).entries[0]
    base = Tolerance(atol=1e-5, rtol=1.3e-6)
    assert X.loosened(e, base, "float32") == Tolerance(atol=1e-5, rtol=1e-5)
    with pytest.raises(X.ExpectationsError, match="above the cap 4"):
        X.loosened(e, Tolerance(atol=1e-3, rtol=1e-6), "bfloat16")


def test_compare_reports_worst_ratio_and_nonfinite_mismatch():
    ref = torch.tensor([1.0, 2.0, float("nan"), float("inf")], dtype=torch.float64)
    out = torch.tensor([1.0, 2.5, float("nan"), float("inf")])
    m = compare(out, ref, atol=0.1, rtol=0.0)
    assert m["max_abs"] == pytest.approx(0.5) and m["max_ratio"] == pytest.approx(5.0)
    assert m["mismatched"] == 1 and m["worst_index"] == [1]
    m = compare(torch.tensor([1.0, 2.0, 0.0, float("inf")]), ref, atol=0.1, rtol=0.0)
    assert m["mismatched"] == 1 and math.isinf(m["max_ratio"])  # NaN where the reference has NaN


def test_to_device_keeps_strides_offsets_and_shared_storage():
    buf = torch.arange(24.0).reshape(2, 12)
    q, k = buf[:, 0:4], buf[:, 4:8]
    dq, dk = to_device((q, k), "cpu")
    assert dq.stride() == q.stride() and dk.storage_offset() == k.storage_offset()
    assert dq.untyped_storage().data_ptr() == dk.untyped_storage().data_ptr()
    assert dq.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()  # a real copy
    assert torch.equal(dq, q) and torch.equal(dk, k)


def test_markdown_and_junit_are_generated_from_the_jsonl(tmp_path):
    header = {"type": "header", "platform": "cpu", "device": "cpu", "device_name": "x", "mode": "quick",
              "seed": 1, "versions": {"torch": torch.__version__}}
    records = [
        {"type": "case", "id": "numerics[rms_norm-native-float32-a]", "check": "numerics", "op": "rms_norm",
         "provider": "native", "dtype": "float32", "status": "pass", "max_ratio": 0.5, "max_abs": 1e-6,
         "atol": 1e-5, "rtol": 1.3e-6, "duration_s": 0.01},
        {"type": "case", "id": "numerics[rms_norm-native-float32-b]", "check": "numerics", "op": "rms_norm",
         "provider": "native", "dtype": "float32", "status": "fail", "max_ratio": float("inf"),
         "message": "bad", "repro": "opcore conformance --case b", "duration_s": 0.01},
        {"type": "case", "id": "platform.members", "check": "platform.members", "status": "xfail",
         "reason": "known", "duration_s": 0.0},
    ]
    paths = write_all(tmp_path, header, records)
    h, recs = read(paths["jsonl"])
    assert paths["markdown"].read_text() == render(h, recs, read_footer(paths["jsonl"]))
    assert "INCOMPLETE" not in paths["markdown"].read_text()
    # a run that died before its footer: the summary says so
    lines = paths["jsonl"].read_text().splitlines()
    assert '"type": "footer"' in lines[-1]
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:-1]) + "\n")
    assert read_footer(cut) is None
    cut_md = render(*read(cut), read_footer(cut))
    assert cut_md.startswith("# opcore conformance: cpu — INCOMPLETE") and "no footer" in cut_md
    md = paths["markdown"].read_text()
    assert "FAILED" in md and "| rms_norm | native | float32 |" in md and "inf" in md
    assert "opcore conformance --case b" in md
    root = ET.parse(paths["junit"]).getroot()
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert suites["numerics"].get("failures") == "1" and suites["platform.members"].get("skipped") == "1"
