"""Issue 31's lead for the rms_norm rows at 4096 tokens, tested: does loading the weight
before the row's reduction (beside the row, as Liger's kernel does) beat loading it after
(as `opcore.kernels.triton.norm` does)?

A one-pass RMSNorm kernel with the weight load placed either way (and each with eviction
hints: the row evicted first), one row per program on 8 warps (the tuned launch of those
rows), and opcore's triton provider called directly (no op dispatch), timed
with ``triton.testing.do_bench`` (L2 flushed between calls) next to Liger's
``LigerRMSNormFunction`` (when installed), ``F.rms_norm`` and a ``copy_`` of the input;
bf16. Prints one JSON line per shape (microseconds, percent of the copy's time), and
opcore's ``ops.rms_norm`` as a user calls it. GPU only.

Usage: python bench/norm_weight_order.py [--shapes 2048x3584,16384x2560]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

SHAPES = ((4096, 4096), (4096, 8192), (32768, 4096), (1024, 7168), (8, 4096))


@triton.jit
def _norm(
    x_ptr,
    w_ptr,
    out_ptr,
    n_cols,
    eps,
    BLOCK_N: tl.constexpr,
    WEIGHT_FIRST: tl.constexpr,
    STREAM_HINTS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    if WEIGHT_FIRST:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if STREAM_HINTS:  # the row is read once: evict it first; the weight every program reads
        x = tl.load(
            x_ptr + row * n_cols + cols, mask=mask, other=0.0, eviction_policy="evict_first"
        )
    else:
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    x = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    if not WEIGHT_FIRST:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _us(fn) -> float:
    fn()
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def _row(t: int, h: int, liger) -> dict:
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(h, device="cuda", dtype=torch.bfloat16)
    out, cp = torch.empty_like(x), torch.empty_like(x)
    block = triton.next_power_of_2(h)
    row: dict = {"tokens": t, "hidden": h}
    for name, first, hints in (
        ("after", False, False),
        ("before", True, False),
        ("after_hints", False, True),
        ("before_hints", True, True),
    ):
        row[name] = _us(
            lambda first=first, hints=hints: _norm[(t,)](
                x,
                w,
                out,
                h,
                1e-6,
                BLOCK_N=block,
                WEIGHT_FIRST=first,
                STREAM_HINTS=hints,
                num_warps=8,
            )  # fmt: skip
        )
    # opcore's triton provider called directly (its launch: the tuning table's or the launch
    # model's; no op dispatch): separates the kernel's time from what a call adds around it.
    from opcore.kernels.triton import _launch, norm

    block_n, rows, _single, warps = _launch.row_params(t, h, _launch.multiprocessors(0))
    row["model"] = dict(BLOCK_N=block_n, ROWS=rows, num_warps=warps)
    row["opcore_kernel"] = _us(lambda: norm.rms_norm(x, w, 1e-6))
    row["F.rms_norm"] = _us(lambda: torch.nn.functional.rms_norm(x, (h,), w, 1e-6))
    if liger is not None:
        row["liger"] = _us(lambda: liger.apply(x, w, 1e-6, 0.0, "llama", False))
    from opcore.ir import ops

    row["opcore"] = _us(lambda: ops.rms_norm(x, w, 1e-6))
    row["copy"] = _us(lambda: cp.copy_(x))
    for k in ("after", "before", "after_hints", "before_hints", "opcore_kernel", "liger", "opcore",
              "F.rms_norm"):  # fmt: skip
        if k in row:
            row[f"{k}_pct_copy"] = 100 * row["copy"] / row[k]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(f"{t}x{h}" for t, h in SHAPES))
    shapes = [tuple(map(int, s.split("x"))) for s in ap.parse_args().shapes.split(",")]
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction as liger
    except ImportError as exc:
        liger = None
        print(f"liger not timed: {exc}")
    for t, h in shapes:
        print(json.dumps(_row(t, h, liger)), flush=True)


if __name__ == "__main__":
    main()
