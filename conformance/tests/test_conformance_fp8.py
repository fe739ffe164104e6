"""fp8 outputs are compared code by code: a provider one code off on ties passes within the
op's fraction, one that rounds the wrong way systematically, or saturates at the wrong
bound, fails; native and a correct reciprocal-multiplying provider pass.

The defects live in a real installed distribution (`opcore.testing.make_distribution`); the
suite runs in a fresh interpreter through ``python -m opcore_conformance`` on the cpu
platform, over ``scaled_fp8_quant``'s samples (its ``ties_t4_h64`` sample holds only exact
rounding ties, its ``saturating_rows`` sample values past the fp8 range), and over the
dynamic quantizers' rows holding NaN and infinities (``nonfinite_rows*``): a provider whose
scale takes NaN or inf into its amax (whole rows NaN or 0) fails there, and only there,
while native (the scale from the finite elements) passes with NaN matched to NaN.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from opcore.testing import make_distribution
from opcore_conformance.tensors import fp8_allowed_off, fp8_code_distance

FP8_DEFECTS = """
import torch

from opcore.ir import ops
from opcore.ir.quant import fp8_dtype, fp8_max


def _scaled(x, scale, bound=None):
    dt = fp8_dtype()
    m = fp8_max(dt) if bound is None else bound
    return (x.float() / scale.float()).clamp(-m, m), dt


def _move(q, where, delta):
    # fp8 bytes are sign-magnitude: +-1 on the byte moves the magnitude one code
    codes = q.view(torch.uint8).to(torch.int16)
    return torch.where(where, codes + delta, codes).to(torch.uint8).view(q.dtype)


def reciprocal(x, scale):
    # correct: multiplies by the float32 reciprocal of the scale (ties may move one code)
    m = fp8_max(fp8_dtype())
    return (x.float() * (1.0 / scale.float())).clamp(-m, m).to(fp8_dtype())


def truncating(x, scale):
    # DEFECT: rounds toward zero instead of to nearest
    v, dt = _scaled(x, scale)
    q = v.to(dt)
    back = q.float()
    return _move(q, (back.abs() > v.abs()) & (back != 0), -1)


def ties_away(x, scale):
    # DEFECT: rounds ties away from zero instead of to the even code
    v, dt = _scaled(x, scale)
    q = v.to(dt)
    back = q.float()
    up = _move(q, torch.ones_like(v, dtype=torch.bool), 1).float()
    tie = (back.abs() < v.abs()) & ((up.abs() - v.abs()) == (v.abs() - back.abs()))
    return _move(q, tie, 1)


def wrong_bound(x, scale):
    # DEFECT: saturates at the e4m3fnuz bound (240) on an e4m3fn platform
    v, dt = _scaled(x, scale, bound=240.0)
    return v.to(dt)


def amax_nonfinite(x, scale_ub=None):
    # DEFECT: the row's amax over every element, NaN and inf included: a NaN makes the
    # scale and the whole row NaN, an inf makes the scale inf and the row 0 (inf / inf NaN)
    m = fp8_max(fp8_dtype())
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.float().reshape(()))
    scales = (amax / m).clamp_min(torch.finfo(torch.float32).tiny)
    return (xf / scales).clamp(-m, m).to(fp8_dtype()), scales


def register():
    if "planted_fp8_trunc" in ops.scaled_fp8_quant.impls:
        return
    ops.dynamic_per_token_scaled_fp8_quant.register_impl("planted_fp8_nan_amax")(
        amax_nonfinite
    )
    ops.scaled_fp8_quant.register_impl("planted_fp8_reciprocal")(reciprocal)
    ops.scaled_fp8_quant.register_impl("planted_fp8_trunc")(truncating)
    ops.scaled_fp8_quant.register_impl("planted_fp8_ties_away")(ties_away)
    ops.scaled_fp8_quant.register_impl("planted_fp8_bound")(wrong_bound)
"""

PROVIDERS = (
    "planted_fp8_reciprocal,planted_fp8_trunc,planted_fp8_ties_away,planted_fp8_bound,native"
)


def test_code_distance_counts_representable_values():
    e4m3 = torch.float8_e4m3fn
    a = torch.tensor([1.0, 1.0, -1.0, 0.0, 448.0, float("nan")]).to(e4m3)
    b = torch.tensor([1.125, 1.25, -1.125, -0.0, 416.0, 1.0]).to(e4m3)
    assert fp8_code_distance(a, b).tolist() == [1, 2, 1, 0, 1, 1 << 20]
    nan = torch.tensor([float("nan")]).to(e4m3)
    assert fp8_code_distance(nan, nan).tolist() == [0]
    # across zero: the smallest subnormals either side are two codes apart
    tiny = torch.tensor([2.0**-9, -(2.0**-9)]).to(e4m3)
    assert fp8_code_distance(tiny[:1], tiny[1:]).tolist() == [2]


def test_allowed_count_adds_a_small_sample_margin():
    assert fp8_allowed_off(1000, 0.0) == 0
    assert fp8_allowed_off(8, 0.04) == 3  # 0.32 expected, +3 sigma
    assert fp8_allowed_off(100_000, 0.04) == 4190  # 4000 + 3 * 63.25, rounded up
    assert 0.04 < fp8_allowed_off(4096, 0.04) / 4096 < 0.05


@pytest.fixture(scope="module")
def fp8_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("fp8-site")
    make_distribution(
        site,
        "opcore-fp8-defects",
        entry_points={"opcore.general_plugins": {"fp8_defects": "fp8_defects:register"}},
        files={"fp8_defects.py": FP8_DEFECTS},
    )
    return site


@pytest.fixture(scope="module")
def fp8_run(fp8_site, tmp_path_factory, run_suite, read_statuses):
    site = fp8_site
    report_dir = tmp_path_factory.mktemp("fp8") / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--ops",
            "scaled_fp8_quant",
            "--providers",
            PROVIDERS,
            "--dtypes",
            "float32,bfloat16",
            "--checks",
            "numerics",
            "--expectations",
            "none",
            "--no-progress",
        ],
        site=site,
        report_dir=report_dir,
    )
    return proc, read_statuses(report_dir)


def _cases(records, provider):
    return {
        (r["dtype"], r["sample"]): r
        for r in records.values()
        if r["check"] == "numerics" and r["provider"] == provider
    }


def test_native_and_a_reciprocal_multiply_pass(fp8_run):
    proc, records = fp8_run
    assert proc.returncode == 1, proc.stderr[-2000:]  # the defects below fail
    for provider in ("native", "planted_fp8_reciprocal"):
        cases = _cases(records, provider)
        assert cases and {r["status"] for r in cases.values()} == {"pass"}, provider
        assert all(r["details"]["fp8_peak_codes"] <= 1 for r in cases.values())


def test_rounding_toward_zero_fails_on_the_fraction(fp8_run):
    _, records = fp8_run
    cases = _cases(records, "planted_fp8_trunc")
    failed = [r for r in cases.values() if r["status"] == "fail"]
    assert len(failed) >= len(cases) // 2, [k for k, r in cases.items() if r["status"] != "fail"]
    assert all("differ from the reference" in r["message"] for r in failed)


def test_ties_away_from_zero_fails_on_exact_ties(fp8_run):
    _, records = fp8_run
    cases = _cases(records, "planted_fp8_ties_away")
    for dtype in ("float32", "bfloat16"):
        rec = cases[(dtype, "ties_t4_h64")]
        assert rec["status"] == "fail" and rec["details"]["fp8_peak_codes"] == 1, rec
        assert rec["details"]["fp8_off_fraction"] > 0.3
    # random inputs almost never sit on a tie: there it passes
    assert cases[("float32", "t5_h128")]["status"] == "pass"


def test_the_wrong_saturation_bound_fails_by_many_codes(fp8_run):
    _, records = fp8_run
    rec = _cases(records, "planted_fp8_bound")[("bfloat16", "saturating_rows_t4_h64")]
    assert rec["status"] == "fail" and rec["details"]["fp8_peak_codes"] > 1
    assert "more than 1 code(s) from the reference" in rec["message"]


def test_a_dumped_fp8_case_reproduces_code_by_code(fp8_site, tmp_path, run_suite):
    cases = {
        "numerics[scaled_fp8_quant-planted_fp8_ties_away-bfloat16-ties_t4_h64]": "FAIL",
        "numerics[scaled_fp8_quant-native-bfloat16-ties_t4_h64]": "PASS",
    }
    args = ["--platform", "cpu", "--expectations", "none", "--no-progress"]
    for case in cases:
        args += ["--case", case]
    run_suite([*args, "--dump", str(tmp_path / "dumps")], site=fp8_site,
              report_dir=tmp_path / "reports")  # fmt: skip
    for case, verdict in cases.items():
        folder = tmp_path / "dumps" / case.replace("[", "_").rstrip("]")
        proc = subprocess.run(
            [sys.executable, str(folder / "repro.py")], capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert proc.stdout.strip().endswith(verdict), proc.stdout + proc.stderr[-2000:]
        assert "fp8 values off the reference" in proc.stdout


@pytest.fixture(scope="module")
def nonfinite_run(fp8_site, tmp_path_factory, run_suite, read_statuses):
    report_dir = tmp_path_factory.mktemp("fp8-nonfinite") / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--ops",
            "dynamic_per_token_scaled_fp8_quant",
            "--providers",
            "planted_fp8_nan_amax,native",
            "--dtypes",
            "float32,bfloat16",
            "--checks",
            "numerics",
            "--expectations",
            "none",
            "--no-progress",
        ],
        site=fp8_site,
        report_dir=report_dir,
    )
    return proc, read_statuses(report_dir)


def test_nan_and_inf_rows_fail_an_amax_that_takes_them_in(nonfinite_run):
    proc, records = nonfinite_run
    assert proc.returncode == 1, proc.stderr[-2000:]
    native = _cases(records, "native")
    nonfinite = {k for k in native if k[1].startswith("nonfinite_rows")}
    assert {s for _, s in nonfinite} == {
        "nonfinite_rows_t6_h64",
        "nonfinite_rows_scale_ub_t6_h64",
    }, sorted(native)
    assert {r["status"] for r in native.values()} == {"pass"}
    planted = _cases(records, "planted_fp8_nan_amax")
    failed = {k for k, r in planted.items() if r["status"] == "fail"}
    # NaN where the reference has codes, or 0 where it has values: many codes off
    assert failed == nonfinite, sorted(failed)
    for key in failed:
        message = planted[key]["message"]
        assert "more than 1 code(s) from the reference" in message, message


def test_opcheck_passes_on_outputs_holding_nan(fp8_site, tmp_path, run_suite, read_statuses):
    """torch.library.opcheck's AOT comparison counts NaN as unequal to NaN; the fp8 ops'
    NaN / inf rows run that comparison with NaN matching NaN (the case says so), and the
    rest of opcheck as usual."""
    cases = [
        "opcheck[dynamic_per_token_scaled_fp8_quant-native-float32-nonfinite_rows_t6_h64]",
        "opcheck[fused_add_rms_norm_static_fp8_quant-native-bfloat16-nonfinite_rows_t6_h64]",
        "opcheck[dynamic_per_token_scaled_fp8_quant-native-float32-t1_h8]",
    ]
    args = ["--platform", "cpu", "--full", "--expectations", "none", "--no-progress"]
    for case in cases:
        args += ["--case", case]
    proc = run_suite(args, site=fp8_site, report_dir=tmp_path / "reports")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    records = read_statuses(tmp_path / "reports")
    assert set(records) == set(cases)
    for case in cases[:2]:
        details = records[case]["details"]
        assert details["equal_nan"] == ["test_aot_dispatch_dynamic"], details
        assert details["default"]["test_aot_dispatch_dynamic"] == "SUCCESS", details
    assert "equal_nan" not in records[cases[2]]["details"]  # finite outputs: opcheck as is
