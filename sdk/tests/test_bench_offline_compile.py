"""bench/offline_compile.py, the one way the offline benches compile a kernel for a GPU
this machine need not have, and the kernel tables that use it: every configuration
`kernel_fingerprint.py` lists gives each of its kernel's compile-time arguments (a kernel
that gains one fails here, not halfway through a fingerprint run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import kernel_fingerprint  # noqa: E402
import offline_compile  # noqa: E402

from opcore.kernels.triton import activation  # noqa: E402


def test_every_fingerprinted_configuration_names_its_kernels_arguments():
    count = 0
    for label, fn, ptrs, floats, constexprs, _ in kernel_fingerprint.cases():
        sig = offline_compile.signature(fn, {**ptrs, **dict.fromkeys(floats, "fp32")}, constexprs)
        assert list(sig) == [p.name for p in fn.params], label
        count += 1
    for _label, fn, types, constexprs, _, divisible in kernel_fingerprint.prefill_cases():
        sig = offline_compile.signature(fn, types, constexprs)
        assert set(divisible) <= {n for n, t in sig.items() if t != "constexpr"}
        count += 1
    assert count > 50


CONSTS = {"ACT": 0, "BLOCK_C": 512, "ROWS": 2, "COLS_FIRST": 0, "EVEN": False}


def test_signature_types_defaults_and_errors():
    fn = activation._act_and_mul_kernel
    sig = offline_compile.signature(fn, {"x_ptr": "*bf16", "out_ptr": "*bf16"}, CONSTS)
    assert sig == {"x_ptr": "*bf16", "x_stride": "i32", "out_ptr": "*bf16", "out_stride": "i32",
                   "n_rows": "i32", "d": "i32", "ACT": "constexpr", "BLOCK_C": "constexpr",
                   "ROWS": "constexpr", "COLS_FIRST": "constexpr", "EVEN": "constexpr"}  # fmt: skip
    with pytest.raises(ValueError, match="constexpr COLS_FIRST has no value"):
        offline_compile.signature(fn, {}, {"ACT": 0, "BLOCK_C": 512, "ROWS": 2, "EVEN": False})
    with pytest.raises(ValueError, match="has no argument.s. y_ptr"):
        offline_compile.signature(fn, {"y_ptr": "*bf16"}, CONSTS)
    # a compile-time argument with a default takes it, as a launch does
    from opcore.attention.backends import _triton_kernels as attn

    got = offline_compile.constants(attn.paged_decode_reduce_kernel,
                                    {"HEAD": 128, "HEAD_PAD": 128, "SPLITS_PAD": 8})  # fmt: skip
    assert got["DECODE_ROWS_ONLY"] is False


def test_divisible_must_name_a_runtime_argument():
    with pytest.raises(ValueError, match="divisible names no runtime argument BLOCK_C"):
        offline_compile.compile_kernel(
            activation._act_and_mul_kernel, {}, CONSTS, divisible=["BLOCK_C"]
        )


def test_sass_opcodes_count_predicated_instructions():
    # The activation kernel's loads are predicated by its mask (`@P0 LDG.E.64`, EVEN off): an opcode
    # pattern that wanted the opcode right after the tab left them, and every other
    # predicated instruction, out of fp8_sass.py's counts.
    compiled = offline_compile.compile_kernel(
        activation._act_and_mul_kernel, {"x_ptr": "*bf16", "out_ptr": "*bf16"}, CONSTS,
        divisible=["x_ptr", "out_ptr", "x_stride", "out_stride", "d"], num_warps=8,
    )  # fmt: skip
    ops = offline_compile.sass_opcodes(compiled)
    assert sum(op.startswith("LDG") for op in ops) == 2  # the gate and the up halves
    assert sum(op.startswith("STG") for op in ops) == 1 and "NOP" not in ops
    assert ops[-1] == "BRA"  # the trailing self-loop after EXIT


def test_bind_call_specialises_as_a_launch_does():
    # A launch's own binder: sizes that are multiples of 16 and the (meta, address 0)
    # tensors are marked aligned, an integer 1 becomes a constant, the compile-time
    # arguments and warps come from the call.
    import torch

    x = torch.empty(1, 2 * 4096, dtype=torch.bfloat16, device="meta")
    out = torch.empty(1, 4096, dtype=torch.bfloat16, device="meta")
    fn = activation._act_and_mul_kernel
    kwargs = dict(CONSTS, num_warps=4)
    sig, constexprs, attrs, options = offline_compile.bind_call(
        fn, (x, 8192, out, 4096, 1, 4096), kwargs
    )
    names = [p.name for p in fn.params]
    assert sig["x_ptr"] == "*bf16" and sig["n_rows"] == "constexpr"
    aligned = {names[k[0]] for k, v in attrs.items() if ["tt.divisibility", 16] in v}
    assert aligned == {"x_ptr", "x_stride", "out_ptr", "out_stride", "d"}
    assert constexprs[(names.index("BLOCK_C"),)] == 512 and options.num_warps == 4
    # 4100 is no multiple of 16: not marked, and the compiled loads are scalar
    _, _, attrs, _ = offline_compile.bind_call(fn, (x, 8200, out, 4100, 1, 4100), kwargs)
    assert {names[k[0]] for k, v in attrs.items() if v} == {"x_ptr", "out_ptr"}


def test_ptxas_report_reads_the_registers_of_the_launch():
    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this Triton build ships no ptxas")
    import torch

    from opcore.kernels.triton import norm

    x = torch.empty(8, 8192, dtype=torch.bfloat16, device="meta")
    consts = dict(HAS_RESIDUAL=False, HAS_WEIGHT=True, BLOCK_N=8192, ROWS=1, SINGLE_PASS=True,
                  N_CHUNKS=1, WEIGHT_FIRST=True, PARTIAL_VARIANCE=False, num_warps=16)  # fmt: skip
    args = (x, 8192, x, 0, x[0], x, 8192, x, 0, 8, 8192, 8192, 1e-6)
    vector = offline_compile.ptxas_report(
        offline_compile.compile_call(norm._rms_norm_kernel, args, consts)
    )
    # the same launch on a row stride that is no multiple of 16: scalar loads, more registers
    args = (x, 8200, x, 0, x[0], x, 8200, x, 0, 8, 8192, 8192, 1e-6)
    scalar = offline_compile.ptxas_report(
        offline_compile.compile_call(norm._rms_norm_kernel, args, consts)
    )
    assert vector["spill_stores"] == scalar["spill_stores"] == 0
    assert 0 < vector["registers"] < scalar["registers"] <= 64
