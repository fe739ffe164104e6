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
