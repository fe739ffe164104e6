"""In-process tests of the expectations file, glob matching, status resolution, the
comparison, and the reports generated from JSONL."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest
import torch

from opcore_conformance import budgets as B
from opcore_conformance import expectations as X
from opcore_conformance import status as S
from opcore_conformance.budgets import budget_for
from opcore_conformance.case import Tolerance
from opcore_conformance.report import write_all
from opcore_conformance.report.jsonl import read, read_footer
from opcore_conformance.report.markdown import render
from opcore_conformance.tensors import (
    ULP_MAGNITUDE_FLOOR,
    compare,
    to_device,
    ulp_error,
    ulp_of,
    ulp_summary,
)


def entry_text(**kw) -> str:
    body = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in kw.items())
    return f"version = 1\n[[expect]]\n{body}\n"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"match": "a*", "status": "xfail"}, "'reason' is required"),
        ({"match": "a*", "status": "xfail", "reason": "  "}, "'reason' is required"),
        ({"match": "a*", "status": "broken", "reason": "r"}, "'status' must be one of"),
        (
            {"match": "a*", "status": "xfail", "reason": "r", "atol": 0.1},
            "only allowed with status 'tolerance'",
        ),
        ({"match": "a*", "status": "tolerance", "reason": "r"}, "needs 'atol' and/or 'rtol'"),
        ({"match": "a*", "status": "tolerance", "reason": "r", "rtol": -1.0}, "finite number >= 0"),
        ({"match": "a*", "status": "skip", "reason": "r", "colour": "red"}, "unknown key"),
        (
            {"match": "a*", "status": "skip", "reason": "r", "error_regex": "x"},
            "only allowed with status 'xfail'",
        ),
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
    e = X.parse(
        entry_text(match="numerics[rms_norm-*-bfloat16-t?_h8]", status="skip", reason="r")
    ).entries[0]
    assert e.matches("numerics[rms_norm-triton-bfloat16-t1_h8]")
    assert not e.matches("numerics[rms_norm-triton-float16-t1_h8]")
    assert not e.matches("numerics[rms_norm-triton-bfloat16-t1_h8]x")
    assert not X.compile_glob("numerics[ab]").fullmatch("numericsa")


def test_first_matching_entry_wins_and_shadowed_entries_are_unmatched():
    exp = X.parse(
        "version = 1\n"
        '[[expect]]\nmatch = "numerics[*]"\nstatus = "skip"\nreason = "all"\n'
        '[[expect]]\nmatch = "numerics[rms_norm-*]"\nstatus = "xfail"\nreason = "shadowed"\n'
    )
    assert exp.lookup("numerics[rms_norm-native-float32-a]").index == 1
    assert [e.index for e in exp.unmatched(["numerics[rms_norm-native-float32-a]"])] == [2]


def test_status_resolution():
    xfail = X.parse(
        entry_text(match="a", status="xfail", reason="r", error_regex="exceed")
    ).entries[0]
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
    header = {
        "type": "header",
        "platform": "cpu",
        "device": "cpu",
        "device_name": "x",
        "mode": "quick",
        "seed": 1,
        "versions": {"torch": torch.__version__},
    }
    records = [
        {
            "type": "case",
            "id": "numerics[rms_norm-native-float32-a]",
            "check": "numerics",
            "op": "rms_norm",
            "provider": "native",
            "dtype": "float32",
            "status": "pass",
            "max_ratio": 0.5,
            "max_abs": 1e-6,
            "atol": 1e-5,
            "rtol": 1.3e-6,
            "duration_s": 0.01,
        },
        {
            "type": "case",
            "id": "numerics[rms_norm-native-float32-b]",
            "check": "numerics",
            "op": "rms_norm",
            "provider": "native",
            "dtype": "float32",
            "status": "fail",
            "max_ratio": float("inf"),
            "message": "bad",
            "repro": "opcore conformance --case b",
            "duration_s": 0.01,
        },
        {
            "type": "case",
            "id": "platform.members",
            "check": "platform.members",
            "status": "xfail",
            "reason": "known",
            "duration_s": 0.0,
        },
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
    assert (
        suites["numerics"].get("failures") == "1"
        and suites["platform.members"].get("skipped") == "1"
    )


# ----------------------------------------------------------------------------- ULP metrics


def test_ulp_of_is_the_dtype_spacing_at_the_value():
    got = ulp_of(torch.tensor([1.0, 1.5, 2.0, -3.0, 0.0]), torch.bfloat16)
    assert got.tolist()[:4] == [2.0**-7, 2.0**-7, 2.0**-6, 2.0**-6]
    info = torch.finfo(torch.bfloat16)
    assert got[4] == info.smallest_normal * info.eps  # the subnormal spacing at zero


def test_ulp_error_tells_correct_from_faithful_from_lost_precision():
    ref = torch.linspace(1.0, 1.99, 1001, dtype=torch.float64)  # one binade: one ULP size
    nearest = ref.to(torch.bfloat16)
    truncated = (ref.float().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    assert float(ulp_error(nearest, ref, torch.bfloat16).max()) <= 0.5
    trunc = ulp_error(truncated, ref, torch.bfloat16)
    assert 0.5 < float(trunc.max()) < 1.0
    off = ulp_error(nearest.double() + 1.5 * 2.0**-7, ref, torch.bfloat16)
    assert float(off.min()) >= 1.0
    s = ulp_summary(off)
    assert s["peak_ulp"] == pytest.approx(float(off.max())) and s["over_1ulp"] > 0.9


def test_ulp_error_measures_tiny_results_at_a_fraction_of_the_outputs_scale():
    ref = torch.tensor([1.0, -1.0, 1.0, 1e-6], dtype=torch.float64)
    out = ref.clone()
    out[3] += 2.0**-10  # a tiny result off by a rounding of terms of magnitude 1
    e = ulp_error(out, ref, torch.bfloat16)
    floor = ULP_MAGNITUDE_FLOOR * float(ref.pow(2).mean().sqrt())
    assert float(e[3]) == pytest.approx(
        2.0**-10 / float(ulp_of(torch.tensor([floor]), torch.bfloat16)[0])
    )
    assert float(e[3]) < 10


def test_ulp_error_of_non_finite_values():
    ref = torch.tensor([float("nan"), float("inf"), 1.0], dtype=torch.float64)
    assert ulp_error(
        torch.tensor([float("nan"), float("inf"), 1.0]), ref, torch.float32
    ).tolist() == [0, 0, 0]
    assert math.isinf(
        float(ulp_error(torch.tensor([0.0, float("inf"), 1.0]), ref, torch.float32)[0])
    )
    assert ulp_summary(torch.zeros(0)) == {"peak_ulp": 0.0, "p99_ulp": 0.0, "over_1ulp": 0.0}


# ------------------------------------------------------------------------------ budgets


def test_budget_defaults_floor_and_factor():
    from opcore.ir import ops

    b = budget_for(ops.rms_norm, "bfloat16")
    assert (b.factor, b.floor_ulps, b.source) == (
        B.DEFAULT_FACTOR,
        B.DEFAULT_FLOOR_ULPS["bfloat16"],
        "default",
    )
    assert b.allowed(0.0) == b.floor_ulps  # native exact: the floor, not zero
    assert b.allowed(10.0) == 10.0 * b.factor


def test_budget_precedence_op_declaration_then_suite_table(monkeypatch):
    from opcore.ir import ops

    monkeypatch.setitem(B.OP_BUDGETS, "rms_norm", {"factor": 3.0, "floor_ulps": {"float16": 2.0}})
    assert budget_for(ops.rms_norm, "float16") == B.Budget(3.0, 2.0, "suite")
    assert budget_for(ops.rms_norm, "bfloat16").floor_ulps == B.DEFAULT_FLOOR_ULPS["bfloat16"]
    monkeypatch.setattr(
        ops.rms_norm,
        "error_budget",
        lambda dtype: (4.0, 1.5) if dtype == torch.float16 else None,
        raising=False,
    )
    assert budget_for(ops.rms_norm, "float16") == B.Budget(4.0, 1.5, "op")
    assert budget_for(ops.rms_norm, "bfloat16").source == "suite"
    monkeypatch.setattr(ops.rms_norm, "error_budget", lambda dtype: (0.5, 1.0), raising=False)
    with pytest.raises(ValueError, match="factor must be a finite number >= 1"):
        budget_for(ops.rms_norm, "float16")


# ------------------------------------------------------------------------------ seeding


def test_sample_seed_is_a_stable_hash_of_op_and_name():
    from opcore.ir.samples import sample_seed

    # pinned: a change here changes every sample of every op (and every recorded result)
    assert sample_seed("rms_norm", "t1_h8") == 7405804835865728807
    assert sample_seed("rms_norm", "t1_h8") != sample_seed("rms_norm", "t1_h9")
    assert sample_seed("rms_norm", "t1_h8") != sample_seed("fused_add_rms_norm", "t1_h8")


def test_a_sample_is_the_same_whatever_precedes_it():
    from opcore.ir.samples import SampleInput, randn, seeded_samples

    def gen(dtype, *, quick, generator):
        names = ["a", "b"] if quick else ["c", "b", "x", "a"]
        for name in names:
            yield SampleInput(name, (randn((3, 5), dtype, generator),))

    quick = {s.name: s.args[0] for s in seeded_samples("op", gen, torch.float32, quick=True)}
    full = {s.name: s.args[0] for s in seeded_samples("op", gen, torch.float32, quick=False)}
    assert torch.equal(quick["a"], full["a"]) and torch.equal(quick["b"], full["b"])
    assert not torch.equal(full["a"], full["b"])
    half = {s.name: s.args[0] for s in seeded_samples("op", gen, torch.bfloat16, quick=True)}
    assert torch.equal(half["a"], quick["a"].to(torch.bfloat16))  # one draw, cast per dtype


def test_sample_names_that_depend_on_the_values_are_refused():
    from opcore.ir.samples import SampleInput, seeded_samples

    def gen(dtype, *, quick, generator):
        x = torch.rand(1, generator=generator)
        yield SampleInput(f"s{int(x * 1e6)}", (x,))

    with pytest.raises(RuntimeError, match="must not depend on the values drawn"):
        list(seeded_samples("op", gen, torch.float32, quick=True))


def test_one_case_id_names_the_same_inputs_in_quick_and_full_mode():
    # through the suite's own sample cache, for every op the suite checks
    from opcore_conformance import irapi

    cache = irapi.SampleCache()
    checked = 0
    for name in irapi.op_names():
        op = irapi.get_op(name)
        quick = {s.name: s for s in cache.samples(op, "float16", True)}
        full = {s.name: s for s in cache.samples(op, "float16", False)}
        assert set(quick) <= set(full), name
        for sample_name, sample in quick.items():
            other = full[sample_name]
            pairs = list(zip(sample.tensors(), other.tensors(), strict=True))
            assert pairs, sample_name
            for (key, a), (_, b) in pairs:
                same = torch.equal(a, b) or (  # NaN samples (the fp8 ops' nonfinite rows)
                    a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                    and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
                )  # fmt: skip
                assert same and a.stride() == b.stride(), f"{name} {sample_name} {key}"
            checked += 1
    assert checked > 100


def test_an_op_declares_its_budget_next_to_its_tolerances():
    import opcore.ir as ir
    from opcore.testing.ir import unregister_op

    def budget_probe_op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    op = ir.register_op(
        budget_probe_op,
        tolerances={torch.float16: (1e-3, 1e-3)},
        error_budgets={torch.float16: (3.0, 2.5)},
    )
    try:
        assert (
            op.error_budget(torch.float16) == (3.0, 2.5) and op.error_budget(torch.bfloat16) is None
        )
        assert budget_for(op, "float16") == B.Budget(3.0, 2.5, "op")
        assert budget_for(op, "bfloat16").source == "default"
    finally:
        unregister_op("budget_probe_op")
