"""Instructions the fp8 quant kernels issue, counted in their sm_90 machine code (SASS),
compiled on this machine by Triton's own ptxas: no GPU needed.

The per-token fp8 kernels on the H200 run near the issue limit rather than the memory
limit (a row kernel issues about one instruction per byte it moves), so the count of
instructions is the first thing a change to them moves. This prints, per kernel variant,
the SASS instructions with the clamp before the conversion (``SATURATES=False``) and with
the conversion saturating alone (``SATURATES=True``, what the CUDA platform declares by
``fp8_convert_saturates``), and the ratio. A count is static (every path of the kernel
once, including the non-finite row's second amax), not a time: the device timing is
`bench/fp8_kernels.py`.

    python bench/fp8_sass.py [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from offline_compile import compile_kernel, sass_opcodes  # noqa: E402  (a sibling script)


def _variants():
    from opcore.kernels.triton import quant

    i = "i32"
    fmt = quant.fp8_format(torch.float8_e4m3fn)
    q = {"q_ptr": "*fp8e4nv"}
    static = dict(x_ptr="*bf16", x_stride=i, scale_ptr="*fp32", n_rows=i, d=i)
    group = dict(x_ptr="*bf16", x_stride=i, s_ptr="*fp32", n_groups_total=i, groups=i,
                 group_size=i, d=i, s_row_stride=i, s_group_stride=i)  # fmt: skip
    rows = dict(x_ptr="*bf16", x_stride=i, r_ptr="*bf16", r_stride=i, w_ptr="*bf16",
                res_ptr="*bf16", scale_ptr="*fp32", s_ptr="*fp32", n_rows=i, n_cols=i,
                eps="fp32")  # fmt: skip
    row_flags = dict(HAS_RESIDUAL=False, HAS_WEIGHT=True, HAS_UB=False,
                     MIN_SCALE=quant.MIN_SCALE, ROWS=1, SINGLE_PASS=True, N_CHUNKS=1)  # fmt: skip
    return fmt, [
        ("rms_norm_static_fp8_quant, 4096 cols", quant._row_quant_kernel, {**rows, **q},
         dict(row_flags, NORM=True, DYNAMIC=False, BLOCK_N=4096)),
        ("rms_norm_dynamic_per_token_quant, 4096 cols", quant._row_quant_kernel, {**rows, **q},
         dict(row_flags, NORM=True, DYNAMIC=True, BLOCK_N=4096)),
        ("dynamic_per_token_scaled_fp8_quant, 4096 cols", quant._row_quant_kernel,
         {**rows, **q}, dict(row_flags, NORM=False, DYNAMIC=True, BLOCK_N=4096)),
        ("scaled_fp8_quant (static kernel), 1024 per program", quant._static_kernel,
         {**static, **q}, dict(GATED=False, BLOCK_C=1024, ROWS=4, COLS_FIRST=False)),
        ("silu_and_mul_per_token_group_fp8_quant, g128", quant._group_quant_kernel,
         {**group, **q}, dict(GATED=True, MIN_SCALE=quant.MIN_SCALE, BLOCK_S=128, GROUPS=16)),
    ]  # fmt: skip


def count(kernel, signature: dict, constexprs: dict, warps: int = 4) -> int:
    """SASS instructions of ``kernel`` compiled for sm_90 (16-byte aligned pointers and
    sizes divisible by 16, as the launcher's tensors are)."""
    divisible = [n for n, t in signature.items() if t.startswith("*") or n in ("d", "n_cols")]
    out = compile_kernel(kernel, signature, constexprs, divisible=divisible, num_warps=warps)
    return len(sass_opcodes(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the counts here")
    args = ap.parse_args(argv)
    from opcore.bench import report

    fmt, variants = _variants()
    rows = []
    print("| kernel | with clamp | conversion saturates | ratio |\n|---|---:|---:|---:|")
    for label, kernel, sig, consts in variants:
        n = {
            sat: count(
                kernel, sig, {**consts, **fmt, "ENCODE": False, "EMULATE": False, "SATURATES": sat}
            )  # fmt: skip
            for sat in (False, True)
        }
        rows.append({"kernel": label, "clamp": n[False], "saturating": n[True]})
        print(f"| {label} | {n[False]} | {n[True]} | {n[True] / n[False]:.3f} |")
    if args.json:
        report.write_json(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
