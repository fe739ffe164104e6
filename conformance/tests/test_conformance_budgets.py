"""Error budgets catch providers that stay inside the absolute tolerance yet lose precision
the reference math does not: each planted defect below fails ``numerics`` in quick mode, and
native, run through the same checks, passes.

The defects live in a real installed distribution (`opcore.testing.make_distribution`); the
suite runs in a fresh interpreter through ``python -m opcore_conformance``. Two of them
reproduce what a plugin author saw pass before budgets existed: rms_norm accumulating in
bf16 (worst err/tol 0.51) and epsilon ignored in fp16 (err/tol 0.97); the tests check that
the budget, not the tolerance, is what catches them.
"""

from __future__ import annotations

import pytest

from opcore.testing import make_distribution

BUDGET_DEFECTS = """
import torch

from opcore.ir import ops

_rms = ops.rms_norm.native


def math_in_input_dtype(x, weight, epsilon, variance_size=None):
    # DEFECT: accumulates and computes in the input dtype: the squares, their mean, the
    # rsqrt and each product are rounded to bf16 / fp16 (what the textbook formula gives
    # when nothing upcasts the input first)
    xv = x if variance_size is None else x[..., :variance_size]
    variance = (xv * xv).mean(dim=-1, keepdim=True)
    out = x * torch.rsqrt(variance + epsilon)
    return out if weight is None else out * weight


def epsilon_ignored(x, weight, epsilon, variance_size=None):
    # DEFECT: epsilon never added (all-zero rows guarded, so no NaN gives it away)
    xf = x.float()
    xv = xf if variance_size is None else xf[..., :variance_size]
    variance = xv.pow(2).mean(dim=-1, keepdim=True)
    inv = torch.where(variance > 0, torch.rsqrt(variance), torch.zeros_like(variance))
    out = xf * inv
    if weight is not None:
        out = out * weight.float()
    return out.to(x.dtype)


def weight_before_normalising(x, weight, epsilon, variance_size=None):
    # DEFECT: scales by the weight first, then normalises the scaled row
    xf = x.float() if weight is None else x.float() * weight.float()
    xv = xf if variance_size is None else xf[..., :variance_size]
    return (xf * torch.rsqrt(xv.pow(2).mean(dim=-1, keepdim=True) + epsilon)).to(x.dtype)


def rounds_twice(x, weight, epsilon, variance_size=None):
    # DEFECT: the normalised value is rounded to the input dtype, then weighted in the
    # input dtype (rounded again)
    normed = _rms(x, None, epsilon, variance_size)
    return normed if weight is None else normed * weight


def residual_rounded_twice(x, x_residual, weight, epsilon, variance_size=None):
    # DEFECT: the residual sum goes through a 16-bit staging buffer of the other format
    # (bf16 for fp16 inputs, fp16 for bf16 inputs) before the input dtype
    staging = torch.bfloat16 if x.dtype == torch.float16 else torch.float16
    if x.dtype not in (torch.float16, torch.bfloat16):
        staging = x.dtype
    residual = (x.float() + x_residual.float()).to(staging).to(x.dtype)
    return _rms(residual, weight, epsilon, variance_size), residual


def rotary_second_half_swapped(positions, query, key, head_size, cos_sin_cache, is_neox):
    # DEFECT: the second half of each rotated pair uses sin where cos belongs and back
    native = ops.rotary_embedding.native
    rot = cos_sin_cache.shape[-1]
    swapped = torch.cat([cos_sin_cache[:, rot // 2:], cos_sin_cache[:, : rot // 2]], dim=-1)
    right = native(positions, query, key, head_size, cos_sin_cache, is_neox)
    wrong = native(positions, query, key, head_size, swapped, is_neox)
    second = torch.arange(rot // 2, rot) if is_neox else torch.arange(1, rot, 2)

    def mix(a, b):
        if a is None:
            return None
        out = a.clone().reshape(-1, head_size)
        out[:, second] = b.reshape(-1, head_size)[:, second]
        return out.reshape(a.shape)

    return mix(right[0], wrong[0]), mix(right[1], wrong[1])


def register():
    if "planted_accum" in ops.rms_norm.impls:
        return
    ops.rms_norm.register_impl("planted_accum")(math_in_input_dtype)
    ops.rms_norm.register_impl("planted_eps_ignored")(epsilon_ignored)
    ops.rms_norm.register_impl("planted_weight_first")(weight_before_normalising)
    ops.rms_norm.register_impl("planted_round_twice")(rounds_twice)
    ops.fused_add_rms_norm.register_impl("planted_residual_twice")(residual_rounded_twice)
    ops.rotary_embedding.register_impl("planted_rotary_swap")(rotary_second_half_swapped)
"""

PROVIDERS = (
    "planted_accum,planted_eps_ignored,planted_weight_first,planted_round_twice,"
    "planted_residual_twice,planted_rotary_swap,native"
)


@pytest.fixture(scope="module")
def budget_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("budget-site")
    make_distribution(
        site,
        "opcore-budget-defects",
        entry_points={"opcore.general_plugins": {"budget_defects": "budget_defects:register"}},
        files={"budget_defects.py": BUDGET_DEFECTS},
    )
    return site


@pytest.fixture(scope="module")
def budget_run(budget_site, tmp_path_factory, run_suite, read_statuses):
    report_dir = tmp_path_factory.mktemp("budgets") / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--ops",
            "rms_norm,fused_add_rms_norm,rotary_embedding",
            "--providers",
            PROVIDERS,
            "--dtypes",
            "float16,bfloat16",
            "--checks",
            "numerics",
            # every rms_norm sample; a few of the others (their defects show on any sample)
            "--case",
            "numerics[rms_norm-*]",
            "--case",
            "numerics[fused_add_rms_norm-*-float16-t5_*]",
            "--case",
            "numerics[rotary_embedding-*-t5_h4_kv2_d64_*]",
            "--expectations",
            "none",
            "--no-progress",
        ],
        site=budget_site,
        report_dir=report_dir,
    )
    return proc, read_statuses(report_dir)


def _cases(records, provider, dtype):
    return [r for r in records.values() if r["provider"] == provider and r["dtype"] == dtype]


def _over_budget(records, provider, dtype):
    """The failed cases whose message is the budget's."""
    return [
        r
        for r in _cases(records, provider, dtype)
        if r["status"] == "fail" and "beyond the error budget" in r["message"]
    ]


def test_the_run_is_red_and_native_passes(budget_run):
    proc, records = budget_run
    assert proc.returncode == 1, proc.stderr[-2000:]
    for dtype in ("float16", "bfloat16"):
        native = _cases(records, "native", dtype)
        assert native and {r["status"] for r in native} == {"pass"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_accumulating_in_the_input_dtype_fails(budget_run, dtype):
    _, records = budget_run
    assert _over_budget(records, "planted_accum", dtype)


def test_bf16_accumulation_inside_the_tolerance_is_caught_by_the_budget(budget_run):
    # every bf16 case is inside atol/rtol: only the comparison with native catches it
    _, records = budget_run
    cases = _cases(records, "planted_accum", "bfloat16")
    assert cases and max(r["max_ratio"] for r in cases) < 1
    failed = _over_budget(records, "planted_accum", "bfloat16")
    assert len(failed) >= len(cases) // 2, [r["sample"] for r in failed]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_epsilon_ignored_fails(budget_run, dtype):
    _, records = budget_run
    failed = _over_budget(records, "planted_eps_ignored", dtype)
    assert failed
    if dtype == "float16":  # the sample with a large epsilon, inside the tolerance
        rec = records["numerics[rms_norm-planted_eps_ignored-float16-eps_1e-2_kwargs]"]
        assert rec["status"] == "fail" and rec["max_ratio"] < 1, rec


@pytest.mark.parametrize(
    "provider", ["planted_weight_first", "planted_rotary_swap", "planted_round_twice"]
)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_wrong_math_fails(budget_run, provider, dtype):
    _, records = budget_run
    assert {r["status"] for r in _cases(records, provider, dtype)} >= {"fail"}


def test_rounding_twice_is_caught_by_the_budget_alone(budget_run):
    _, records = budget_run
    for dtype in ("bfloat16", "float16"):
        cases = _cases(records, "planted_round_twice", dtype)
        assert max(r["max_ratio"] for r in cases) < 1
        assert _over_budget(records, "planted_round_twice", dtype)


def test_a_residual_rounded_twice_fails_in_fp16(budget_run):
    # through bf16, an fp16 residual loses three bits; through fp16, a bf16 one loses none
    # worth measuring, so only fp16 can show it
    _, records = budget_run
    assert _over_budget(records, "planted_residual_twice", "float16")


def test_the_failure_shows_the_provider_next_to_native(budget_run):
    _, records = budget_run
    rec = records["numerics[rms_norm-planted_eps_ignored-float16-eps_1e-2_kwargs]"]
    message, details = rec["message"], rec["details"]
    assert "planted_eps_ignored peak" in message and "native on the same inputs peak" in message
    assert "allowed peak" in message and "floor" in message
    assert details["peak_ulp"] > details["ulp_budget"] >= details["budget_floor_ulps"]
    assert details["native_peak_ulp"] <= 0.5 + 1e-3  # native rounds correctly here
    for key in ("p99_ulp", "over_1ulp", "native_p99_ulp", "native_over_1ulp", "native_max_ratio"):
        assert key in details, key
    assert details["budget_source"] == "default"
