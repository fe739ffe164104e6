"""Correctness of every `triton` provider on the current device against the native
reference computed on the CPU in float64: each op's full sample set (odd sizes, one token,
strided rows, 2-D to 4-D, no weight, partial rotary, both rotary styles), fp32/fp16/bf16,
through the default overload and, for in-place providers, `maybe_inplace`.

A quick stand-alone check for a GPU run; `opcore conformance` is the full suite.
Exit status 1 on any mismatch. Usage: ``python bench/check_triton.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from opcore.bench.report import write_json


def _tensors(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _to64(v):
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.detach().cpu().double()
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import opcore.kernels.triton as kt
    from opcore.ir import ops
    from opcore.kernels import FP8_OPS, TRITON_OPS
    from opcore.platforms import get_current_platform

    device = get_current_platform().device()
    print(
        f"triton provider: interpreted={kt.INTERPRETED} devices={sorted(kt.DEVICE_TYPES)} "
        f"on {device}"
    )
    failures, total, worst = [], 0, {}
    # The fp8 ops have their own check with fp8 budgets: bench/fp8_kernels.py check.
    for name in (n for n in TRITON_OPS if n not in FP8_OPS):
        op = getattr(ops, name)
        impl = op.impls["triton"]
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            atol, rtol = op.tolerance(dtype)
            for sample in op.sample_inputs("cpu", dtype, quick=False):
                ref = _tensors(
                    op.impls["native"].impl_fn(*[_to64(a) for a in sample.args], **sample.kwargs)
                )
                dev = sample.to(device)
                if impl.supports_args is not None and not impl.supports_args(
                    *dev.args, **dev.kwargs
                ):
                    total += 1
                    failures.append(f"{name}/{dtype}/{sample.name}: supports_args rejected")
                    continue
                variants = [("default", impl.functional)]
                if impl.inplace:
                    variants.append(("in place", impl.impl_fn))
                for label, fn in variants:
                    total += 1
                    call = dev.clone() if hasattr(dev, "clone") else dev
                    got = _tensors(fn(*call.args, **call.kwargs))
                    torch.cuda.synchronize() if device.type == "cuda" else None
                    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
                        if r is None:
                            if g is not None:
                                failures.append(
                                    f"{name}/{dtype}/{sample.name}/{label}: "
                                    f"output {i} should be None"
                                )
                            continue
                        g64 = g.detach().cpu().double()
                        err = (g64 - r).abs()
                        bound = atol + rtol * r.abs()
                        ratio = float((err / bound).max()) if err.numel() else 0.0
                        key = f"{name}/{str(dtype).removeprefix('torch.')}"
                        worst[key] = max(worst.get(key, 0.0), ratio)
                        if g.dtype != dtype or not torch.isfinite(g64).all() or ratio > 1.0:
                            failures.append(
                                f"{name}/{dtype}/{sample.name}/{label}: out {i} err/tol {ratio:.2f}"
                            )
    print(f"{total - len(failures)}/{total} checks passed")
    for k, v in sorted(worst.items()):
        print(f"  worst err/tol {k:<36} {v:.3f}")
    for f in failures[:50]:
        print("FAIL", f)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_json(
            {"device": str(device), "total": total, "failures": failures, "worst": worst},
            os.path.join(args.out, "check_triton.json"),
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
