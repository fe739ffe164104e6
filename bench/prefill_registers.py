"""Registers and spills of the paged prefill kernel per launch configuration, compiled for a
GPU this machine need not have (issue 29: the launch choices' register leads).

Each configuration of `CONFIGS` (or the shipped choice per head size and page size) is
compiled by Triton for ``--arch`` (default sm_90, an H100 or H200) with the compile-time
arguments `_triton_prefill.kernel_constants` gives a real launch, and with the alignment a
real launch is specialised on (16-byte tensors, strides that are multiples of 16); Triton's
own ``ptxas -v`` then reports the registers per thread, spill stores and loads, and the
shared memory. No GPU and no timing: the figures explain sweep results, they do not rank.

Usage: python bench/prefill_registers.py [--arch 90] [--out FILE.md] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from offline_compile import compile_kernel, ptxas_report  # noqa: E402  (a sibling script)

# (label, head size, page size, heads, kv heads, PrefillLaunch keyword arguments or None for
# the shipped choice on a device that copies descriptor tiles).
CONFIGS = (
    ("d128 pages 128 shipped", 128, 128, 32, 8, None),
    ("d128 descriptors 128x64 w4, rows held", 128, 128, 32, 8,
     dict(block_m=128, block_n=64, num_warps=4, num_stages=3, kv_tma=True, pack_gqa=True)),
    ("d128 groups of 7, descriptors, rows held", 128, 128, 28, 4,
     dict(block_m=128, block_n=64, num_warps=4, num_stages=3, kv_tma=True, pack_gqa=True)),
    ("d128 groups of 7, descriptors, late rows", 128, 128, 28, 4,
     dict(block_m=128, block_n=64, num_warps=4, num_stages=3, kv_tma=True, pack_gqa=True,
          late_rows=True)),
    ("d128 pages 16 shipped", 128, 16, 32, 8, None),
    ("d128 pointers 64x64, rows held", 128, 16, 32, 8,
     dict(block_m=64, block_n=64, num_warps=4, num_stages=2, pack_gqa=True)),
    ("d128 pointers 128x64 w4", 128, 16, 32, 8,
     dict(block_m=128, block_n=64, num_warps=4, num_stages=2, pack_gqa=True)),
    ("d64 pages 16 shipped", 64, 16, 32, 8, None),
    ("d64 pointers 128x128, late rows", 64, 16, 32, 8,
     dict(block_m=128, block_n=128, num_warps=4, num_stages=3, late_rows=True)),
    ("d256 pages 128 shipped", 256, 128, 32, 8, None),
    ("d256 pages 16 shipped", 256, 16, 32, 8, None),
)  # fmt: skip


def prefill_build(cfg, head: int, page: int, group: int, dtype: str = "bf16") -> tuple:
    """``(kernel, types, constexprs, options, divisible)``: the paged prefill kernel under
    ``cfg`` (a `PrefillLaunch`) for a head size, page size and query heads per kv head, as
    `launch_prefill` specialises it (`_triton_prefill.kernel_constants`; 16 sequences,
    causal) and aligned as a real cache is: the tensors, and the strides (multiples of 16)
    the kernel lets Triton specialise on. `kernel_fingerprint.py` builds its prefill cases
    with it too."""
    from opcore.attention.backends import _triton_prefill as P

    kernel = P.paged_prefill_kernel
    constexprs = P.kernel_constants(
        cfg, group=group, head_size=head, block_size=page, num_seqs=16, causal=True,
        softcap=0.0, skip_decode_rows=False, interpret=False, same_strides=True,
    )  # fmt: skip
    p = f"*{dtype}"
    pointers = {"Q": p, "K": p, "V": p, "Out": p, "query_start_loc": "*i32",
                "seq_lens": "*i32", "block_table": "*i32"}  # fmt: skip
    divisible = [
        q.name for q in kernel.params
        if not q.is_constexpr and q.name not in constexprs and q.name != "qk_scale"
        and (q.name in pointers or not q.do_not_specialize)
    ]  # fmt: skip
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return kernel, {**pointers, "qk_scale": "fp32"}, constexprs, options, divisible


def compile_stats(cfg, head: int, page: int, heads: int, kv: int, arch: int) -> dict:
    """``{"registers", "spill_stores", "spill_loads", "shared"}`` of the kernel compiled for
    ``sm_<arch>`` under ``cfg`` (a `PrefillLaunch`)."""
    kernel, types, constexprs, options, divisible = prefill_build(cfg, head, page, heads // kv)
    compiled = compile_kernel(
        kernel, types, constexprs, divisible=divisible, target=f"cuda:{arch}", **options
    )
    return ptxas_report(compiled, arch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10")
    ap.add_argument("--out", help="also write the markdown table here")
    ap.add_argument("--quick", action="store_true", help="the first two configurations only")
    args = ap.parse_args(argv)
    import torch

    from opcore.attention.backends import _triton_prefill as P

    lines = [
        f"# Paged prefill kernel: registers per thread and spills, sm_{args.arch}",
        "",
        "| configuration | launch | registers | spill stores (B) | spill loads (B) | shared (B) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for label, head, page, heads, kv, kw in CONFIGS[:2] if args.quick else CONFIGS:
        if kw is None:
            cfg = P.prefill_launch_config(head, torch.bfloat16, page, True)
        else:
            cfg = P.PrefillLaunch(**kw)
        s = compile_stats(cfg, head, page, heads, kv, args.arch)
        launch = (
            f"{cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"
            f"{' descriptors' if cfg.kv_tma else ''}{' packed' if cfg.pack_gqa else ''}"
            f"{' late rows' if cfg.late_rows else ''}"
        )
        lines.append(
            f"| {label} ({heads}/{kv}) | {launch} | {s['registers']} | {s['spill_stores']} "
            f"| {s['spill_loads']} | {s['shared']} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
