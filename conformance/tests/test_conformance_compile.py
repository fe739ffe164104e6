"""The ``compile.*`` checks catch planted defects, each with the right status, and pass
correct providers. The providers live in a real installed distribution (registered by an
``opcore.general_plugins`` entry point); the suite runs in a fresh interpreter through
``python -m opcore_conformance``, compiling with the real ``torch.compile`` and
`opcore.compile` (the eager backend mode of ``--quick``)."""

from __future__ import annotations

import json

import pytest

from opcore.testing import make_distribution

COMPILE_PROVIDERS = """
import torch
from torch._subclasses.fake_tensor import FakeTensor

from opcore.ir import ops


# The op's reference; each defect below departs from it in one way.
_rms = ops.rms_norm.native


def good(x, weight, epsilon, variance_size=None):
    return _rms(x, weight, epsilon, variance_size)


def fake_differs(x, weight, epsilon, variance_size=None):
    # DEFECT: a shortcut taken when the tensors carry no data, as while compiling: the
    # traced code drops the weight, so compiled code computes something else than eager.
    if isinstance(x, FakeTensor):
        weight = None
    return _rms(x, weight, epsilon, variance_size)


def untraceable(x, weight, epsilon, variance_size=None):
    # Correct, but reads a value: it cannot run on fake tensors (lowered as an opaque call).
    if float(x.abs().max()) == 0.0:
        return torch.zeros_like(x)
    return _rms(x, weight, epsilon, variance_size)


def wide_rows_only(x, weight, epsilon, variance_size=None):
    return x.shape[-1] >= 64


def real_tensors_only(x, weight, epsilon, variance_size=None):
    # DEFECT: answers from the tensor's type, not its metadata: True in eager, False on
    # the fake tensors lowering sees, so compiled graphs run another provider.
    return not isinstance(x, FakeTensor)


def many_tokens(x):
    # DEFECT: branches on the token count, so a dynamic batch adds a guard and recompiles.
    return bool(x.shape[0] > 4)


def fused_stale_residual(x, x_residual, weight, epsilon, variance_size=None):
    # DEFECT: normalizes the sum but returns the residual it was given, not the sum.
    return _rms((x + x_residual).contiguous(), weight, epsilon, variance_size), x_residual.clone()


def quant_scales_x2(x, weight, epsilon, residual=None, scale_ub=None):
    # DEFECT: the per-token scales are twice the ones it quantized with (the codes are
    # right): a GEMM reading them doubles its output. Only a fused graph runs it.
    native = ops.rms_norm_dynamic_per_token_quant.native
    q, scales, res = native(x, weight, epsilon, residual, scale_ub)
    return q, scales * 2, res


def register():
    if "compile_good" in ops.rms_norm.impls:
        return
    ops.rms_norm_dynamic_per_token_quant.register_impl("compile_quant_scales_x2")(
        quant_scales_x2
    )
    ops.rms_norm.register_impl("compile_good")(good)
    ops.rms_norm.register_impl("compile_fake_differs")(fake_differs)
    ops.rms_norm.register_impl("compile_untraceable")(untraceable)
    ops.rms_norm.register_impl("compile_wide_rows", supports_args=wide_rows_only)(good)
    ops.rms_norm.register_impl("compile_absent", supported=False)(good)
    ops.rms_norm.register_impl("compile_real_only", supports_args=real_tensors_only)(good)
    ops.silu_and_mul.register_impl("compile_many_tokens", supports_args=many_tokens)(
        ops.silu_and_mul.native
    )
    ops.fused_add_rms_norm.register_impl("compile_stale_residual")(fused_stale_residual)
"""

PROVIDERS = (
    "compile_good,compile_fake_differs,compile_untraceable,compile_wide_rows,compile_absent,native"
)
# Eager dispatch picks the planted providers first; lowering must pick the same.
PRIORITY = "rms_norm=compile_real_only,native;silu_and_mul=compile_many_tokens,native"


@pytest.fixture(scope="module")
def compile_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("compile-site")
    make_distribution(
        site,
        "opcore-compile-planted",
        entry_points={"opcore.general_plugins": {"compile_planted": "compile_planted:register"}},
        files={"compile_planted.py": COMPILE_PROVIDERS},
    )
    return site


@pytest.fixture(scope="module")
def compile_run(compile_site, tmp_path_factory, run_suite, read_statuses):
    report_dir = tmp_path_factory.mktemp("compile") / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--checks",
            "compile",
            "--ops",
            "rms_norm,silu_and_mul",
            "--providers",
            PROVIDERS,
            "--dtypes",
            "float32",
            "--expectations",
            "none",
            "--no-progress",
        ],
        site=compile_site,
        report_dir=report_dir,
        env={"OPCORE_IR_OP_PRIORITY": PRIORITY},
    )
    return proc, read_statuses(report_dir)


def _by_provider(records, provider, op="rms_norm"):
    return {
        r["sample"]: r
        for r in records.values()
        if r["check"] == "compile.matches_eager" and r["provider"] == provider and r["op"] == op
    }


def test_correct_providers_pass_in_the_eager_backend_mode(compile_run):
    proc, records = compile_run
    assert proc.returncode == 1, proc.stderr[-2000:]
    for provider in ("compile_good", "native"):
        got = _by_provider(records, provider)
        assert set(got) == {"t1_h8", "t1_h4096"}, got  # quick: the first two samples
        assert {r["status"] for r in got.values()} == {"pass"}, got
        assert all(r["details"]["mode"] == "eager" for r in got.values())
    assert (
        records["compile.matches_eager[rms_norm-compile_good-float32-t1_h8-eager]"]["details"][
            "how"
        ]
        == "traced"
    )
    assert not [i for i in records if i.endswith("-inductor]") or i.endswith("[inductor]")]


def test_traced_code_that_differs_from_eager_fails(compile_run):
    _, records = compile_run
    got = _by_provider(records, "compile_fake_differs")
    assert got and {r["status"] for r in got.values()} == {"fail"}, got
    rec = got["t1_h8"]
    assert "compiled (eager) vs eager" in rec["message"] and "differs" in rec["message"]
    # the run depended on OPCORE_IR_OP_PRIORITY: the rerun line sets it again
    assert rec["repro"].startswith(
        f"OPCORE_IR_OP_PRIORITY='{PRIORITY}' opcore conformance --platform cpu"
    )
    assert (
        "--case 'compile.matches_eager[rms_norm-compile_fake_differs-float32-t1_h8-eager]' "
        "--expectations none --report-dir "
    ) in rec["repro"]


def test_untraceable_provider_is_lowered_opaquely_and_passes(compile_run):
    _, records = compile_run
    got = _by_provider(records, "compile_untraceable")
    assert got and {r["status"] for r in got.values()} == {"pass"}, got
    assert {r["details"]["how"] for r in got.values()} == {"opaque"}


def test_declined_and_unsupported_providers_are_unsupported_not_failed(compile_run):
    _, records = compile_run
    wide = _by_provider(records, "compile_wide_rows")
    assert (
        wide["t1_h8"]["status"] == "unsupported" and "does not accept" in wide["t1_h8"]["message"]
    )
    assert wide["t1_h4096"]["status"] == "pass"
    absent = _by_provider(records, "compile_absent")
    assert absent and {r["status"] for r in absent.values()} == {"unsupported"}
    assert "not supported here" in absent["t1_h8"]["message"]


def test_lowering_that_picks_another_provider_fails(compile_run):
    _, records = compile_run
    rec = records["compile.lowering[rms_norm-float32-t1_h8-eager]"]
    assert rec["status"] == "fail", rec
    assert "lowering chose ['native'], eager dispatch chooses 'compile_real_only'" in rec["message"]
    # a supports_args that decides from metadata lowers as eager dispatch decides
    ok = [r for i, r in records.items() if i.startswith("compile.lowering[silu_and_mul-")]
    assert ok and {r["status"] for r in ok} == {"pass"}
    assert {r["details"]["chosen"] for r in ok} == {"native", "compile_many_tokens"}


def test_supports_args_branching_on_the_batch_recompiles(compile_run):
    _, records = compile_run
    rec = records["compile.dynamic_batch[eager]"]
    assert rec["status"] == "fail" and "compiled 2 graphs, expected 1" in rec["message"], rec


def test_fusion_fires_and_keeps_the_output_with_correct_providers(compile_run):
    _, records = compile_run
    rec = records["compile.fusion[eager]"]
    assert rec["status"] == "pass", rec
    assert rec["details"]["fusions"] == {"fuse_split_qkv_rmsnorm_rope": 2, "fuse_add_rms_norm": 4}


def test_wrong_fused_provider_fails_fusion_only_where_fusion_fires(
    compile_site, tmp_path, run_suite, read_statuses
):
    # The eager decoder never calls fused_add_rms_norm; only the fused graph runs the
    # defective provider.
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--expectations",
            "none",
            "--no-progress",
            "--case",
            "compile.fusion[eager]",
        ],
        site=compile_site,
        report_dir=tmp_path / "r",
        env={"OPCORE_IR_OP_PRIORITY": "fused_add_rms_norm=compile_stale_residual"},
    )
    records = read_statuses(tmp_path / "r")
    assert list(records) == ["compile.fusion[eager]"]
    rec = records["compile.fusion[eager]"]
    assert rec["status"] == "fail" and "decoder compiled with fusion vs eager" in rec["message"], (
        rec
    )
    assert proc.returncode == 1


def test_quant_fusion_passes_and_a_wrong_fused_kernel_fails_it(
    compile_site, tmp_path, run_suite, read_statuses
):
    case = "compile.quant_fusion[eager]"
    for priority, status in (
        (None, "pass"),
        ("rms_norm_dynamic_per_token_quant=compile_quant_scales_x2", "fail"),
    ):
        report_dir = tmp_path / status
        proc = run_suite(
            ["--platform", "cpu", "--expectations", "none", "--no-progress", "--case", case],
            site=compile_site,
            report_dir=report_dir,
            env={"OPCORE_IR_OP_PRIORITY": priority} if priority else {},
        )
        rec = read_statuses(report_dir)[case]
        assert rec["status"] == status, rec
        assert rec["dtype"] == "bfloat16"
        if status == "pass":
            assert proc.returncode == 0, proc.stderr[-2000:]
            assert set(rec["details"]["fusions"].values()) == {1}, rec
            assert len(rec["details"]["fusions"]) == 6, rec
        else:
            # the unfused graph never calls the fused op: only the fusion exposes the defect
            assert proc.returncode == 1
            assert "rms_norm_dynamic_per_token_quant" in rec["message"], rec
            assert "fused vs unfused" in rec["message"], rec


def test_full_mode_adds_inductor_cases(compile_site, tmp_path, run_suite):
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--full",
            "--checks",
            "compile",
            "--ops",
            "rms_norm",
            "--providers",
            "native",
            "--dtypes",
            "float32",
            "--list",
        ],
        site=compile_site,
        report_dir=tmp_path / "r",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ids = [json.loads(line)["id"] for line in proc.stdout.splitlines()]
    inductor = sorted(i for i in ids if "inductor" in i)
    assert inductor == [
        "compile.dynamic_batch[inductor]",
        "compile.fusion[inductor]",
        "compile.lowering[rms_norm-float32-t1_h4096-inductor]",
        "compile.lowering[rms_norm-float32-t1_h8-inductor]",
        "compile.matches_eager[rms_norm-native-float32-t1_h4096-inductor]",
        "compile.matches_eager[rms_norm-native-float32-t1_h8-inductor]",
    ]
    eager = [i for i in ids if i.startswith("compile.matches_eager[") and i.endswith("-eager]")]
    assert len(eager) > 2  # every sample of the full set
