"""Whether every launch configuration of the rotary kernel gives the bits of the default
one, and how far apart they are where not (a GPU tool; the interpreter has no codegen).

The H200 launch sweep of 2026-12-05 found rotary configurations whose output was not
bit-identical to the default configuration's (32/8 heads x 128 on 1-2 warps, 32/8 x 64 on
2 warps and more at 1-4 tokens). The kernel is elementwise per pair, so a configuration
changes no order of a reduction; under the interpreter all configurations agree. This
prints, per layout, token count and configuration that differs: the elements that differ,
the largest difference in units of the output dtype's last place, and each one's largest
error against the float64 native function, so that a difference of one unit (the compiler
contracting ``a * cos - b * sin`` to a fused multiply-add differently) is told apart from
a wrong element (a kernel bug).

    python bench/head_exactness.py [--hidden 4096,2048] [--tokens 2,16,256] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys

import torch

from opcore.bench import cases, report
from opcore.ir import ops
from opcore.kernels.triton import PROVIDER
from opcore.tuning import runtime

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from sweep_launch import head_configs  # noqa: E402


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between ``a`` and ``b`` in units of their dtype's last place."""
    if a.numel() == 0:
        return 0
    spacing = torch.finfo(a.dtype).eps * b.float().abs().clamp_min(torch.finfo(a.dtype).tiny)
    return int(((a.float() - b.float()).abs() / spacing).max().ceil())


def check(hidden: int, tokens: int, dtype: torch.dtype, device: str) -> list[dict]:
    op = "rotary_embedding"
    case = cases.build(op, tokens, hidden, dtype, device)
    args = case.args
    heads = (args[1].shape[1] // args[3], args[2].shape[1] // args[3], args[3])
    impl = ops.rotary_embedding.impls[PROVIDER]
    native = ops.rotary_embedding.impls["native"].functional

    def fresh(double: bool = False):
        out = []
        for a in args:
            a = a.clone() if isinstance(a, torch.Tensor) else a
            if double and isinstance(a, torch.Tensor) and a.is_floating_point():
                a = a.double()
            out.append(a)
        return out

    exact = native(*fresh(double=True))
    want = impl.functional(*fresh())
    rows = []
    for cfg in head_configs(tokens, heads):
        with runtime.forced(op, PROVIDER, cfg):
            got = impl.functional(*fresh())
        differ = sum(int((g != w).sum()) for g, w in zip(got, want, strict=True))
        rows.append(
            {
                "hidden": hidden,
                "heads": list(heads),
                "tokens": tokens,
                "config": cfg,
                "differing": differ,
                "ulps_vs_default": max(ulps(g, w) for g, w in zip(got, want, strict=True)),
                "err_vs_fp64": max(
                    float((g.double() - e).abs().max()) for g, e in zip(got, exact, strict=True)
                ),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="4096,2048")
    ap.add_argument("--tokens", default="2,16,256")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, a.dtype)
    rows = []
    for hidden in map(int, a.hidden.split(",")):
        for tokens in map(int, a.tokens.split(",")):
            got = check(hidden, tokens, dtype, device)
            rows += got
            bad = [r for r in got if r["differing"]]
            worst = max((r["err_vs_fp64"] for r in got), default=0.0)
            print(
                f"hidden {hidden} heads {got[0]['heads']} tokens {tokens}: "
                f"{len(bad)}/{len(got)} configurations differ from the default; "
                f"largest error vs float64 {worst:.3g}",
                flush=True,
            )
            for r in bad:
                print(
                    f"  {r['config']}: {r['differing']} elements, "
                    f"{r['ulps_vs_default']} ulp, err vs fp64 {r['err_vs_fp64']:.3g}"
                )
    if a.json:
        report.write_json(rows, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
