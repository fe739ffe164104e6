"""fp8 cases where the device cannot hold fp8 tensors (`opcore_conformance.fp8`).

A platform that declares no ``fp8_dtype`` on a device that cannot hold ``float8_e4m3fn``
(the virtual device: its dtypes are a fixed list) gets every fp8 case as
``not_applicable``, with the reason: the cases of ops that return fp8 (the quantization
ops) and of ops that take it (a planted dequantization op). A platform that declares an
fp8 dtype is taken at its word: on the same device its fp8 cases run, and fail. The CPU
declares none and holds fp8: its fp8 cases run (their failures are seen in
test_conformance_fp8.py).

The suite runs in a fresh interpreter (the virtual device renames PrivateUse1, once per
process), on one dtype and three checks to stay quick.
"""

from __future__ import annotations

import pytest
import torch

from opcore.testing import make_distribution
from opcore_conformance import fp8
from opcore_conformance.options import Options
from opcore_conformance.session import Context

# A dequantization op: takes fp8 codes, returns the case's dtype. Its cases hold an fp8
# tensor in every sample, so they need fp8 storage although nothing fp8 comes out.
FP8_INPUT_OP = """
import torch

from opcore.ir.op import all_ops, register_op
from opcore.ir.samples import SampleInput


def register():
    if "planted_fp8_dequant" in all_ops():
        return

    @register_op
    def planted_fp8_dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return q.to(scale.dtype) * scale

    @planted_fp8_dequant.register_sample_inputs
    def _samples(dtype, *, quick, generator):
        codes = torch.randn(4, 32, generator=generator).to(torch.float8_e4m3fn)
        yield SampleInput("t4_h32", (codes, torch.full((4, 1), 0.5, dtype=dtype)))
"""

# The virtual device's platform with one change: it declares float8_e4m3fn.
DECLARING_PLATFORM = """
import torch

from opcore_plugin_vdev.platform import VdevPlatform


class DeclaresFp8(VdevPlatform):
    name = "vdev_fp8"
    fp8_dtype = torch.float8_e4m3fn  # DEFECT: the virtual device cannot hold it
    conformance_expectations = None


def probe():
    return "declares_fp8.DeclaresFp8"
"""

ARGS = [
    "--ops",
    "scaled_fp8_quant,planted_fp8_dequant,rms_norm",
    "--dtypes",
    "float32",
    "--checks",
    "numerics,functional,opcheck",
    "--expectations",
    "none",
    "--no-progress",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("fp8-devices-site")
    make_distribution(
        site,
        "opcore-fp8-input-op",
        entry_points={"opcore.general_plugins": {"fp8_input_op": "fp8_input_op:register"}},
        files={"fp8_input_op.py": FP8_INPUT_OP},
    )
    make_distribution(
        site,
        "opcore-plugin-declares-fp8",
        entry_points={"opcore.platform_plugins": {"vdev_fp8": "declares_fp8:probe"}},
        files={"declares_fp8.py": DECLARING_PLATFORM},
    )
    return site


def _run(platform, site, tmp_path, run_suite, read_statuses):
    report_dir = tmp_path / platform
    proc = run_suite(
        ["--platform", platform, *ARGS],
        site=site,
        report_dir=report_dir,
        env={"OPCORE_VDEV": "1"},
        timeout=300,
    )
    records = read_statuses(report_dir)
    by_op: dict[str, list[dict]] = {}
    for rec in records.values():
        by_op.setdefault(rec["op"], []).append(rec)
    return proc, by_op


def test_fp8_cases_are_not_applicable_where_the_device_cannot_hold_fp8(
    site, tmp_path, run_suite, read_statuses
):
    proc, by_op = _run("vdev", site, tmp_path, run_suite, read_statuses)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for op in ("scaled_fp8_quant", "planted_fp8_dequant"):
        cases = by_op[op]
        assert {c["check"] for c in cases} == {"numerics", "functional", "opcheck"}, op
        for c in cases:
            assert c["status"] == "not_applicable", c
            # the rule, the platform, the dtype, and the device's own words
            assert c["message"].startswith(
                f"{op} takes or returns fp8 tensors: platform 'vdev' declares no fp8_dtype "
                "and device vdev:0 cannot hold float8_e4m3fn tensors (TypeError: "
            ), c["message"]
            assert "does not support float8_e4m3fn" in c["message"]
    # the ops without fp8 run as before
    assert by_op["rms_norm"] and {c["status"] for c in by_op["rms_norm"]} == {"pass"}


def test_a_declared_fp8_dtype_is_trusted_so_its_cases_run_and_fail(
    site, tmp_path, run_suite, read_statuses
):
    proc, by_op = _run("vdev_fp8", site, tmp_path, run_suite, read_statuses)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    quant = by_op["scaled_fp8_quant"]
    assert quant and {c["status"] for c in quant} == {"fail"}, {c["status"] for c in quant}
    assert all("does not support float8_e4m3fn" in c["message"] for c in quant)
    assert {c["status"] for c in by_op["rms_norm"]} == {"pass"}


def test_the_cpu_declares_none_and_holds_fp8_so_its_cases_run():
    from opcore_plugin_cpu.platform import CpuPlatform

    platform = CpuPlatform()
    assert platform.fp8_dtype is None
    ctx = Context(options=Options(), platform=platform, device=torch.device("cpu"), seed=None)
    assert fp8.missing_reason(ctx) is None
