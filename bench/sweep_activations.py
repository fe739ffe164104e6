"""Launch-shape sweep for the triton gated activations at many tokens (a GPU tool).

A program covers a ``[ROWS, BLOCK_C]`` tile of the output
(`opcore.kernels.triton._launch.elementwise_params`, which this replaces for each
variant). Times every ``BLOCK_C x ROWS x num_warps`` choice of ``silu_and_mul`` on the
bench's shapes next to ``torch.compile`` of the native function (as `opcore bench` builds
it), checks each against the native op, and prints the time relative to torch.compile:

    PYTHONPATH=sdk/src python bench/sweep_activations.py [--tokens 32768] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from opcore.bench import timing
from opcore.bench.report import write_json
from opcore.ir import ops
from opcore.kernels.triton import _launch, activation
from opcore.platforms import get_current_platform


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    platform = get_current_platform()  # its timing events time the kernels
    chosen = _launch.elementwise_params
    rows_out = []
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}", flush=True)
    compiled = torch.compile(ops.silu_and_mul.impls["native"].impl_fn, dynamic=False)
    for inter in (14336, 28672):
        t = args.tokens
        x = torch.randn(t, 2 * inter, device=dev, dtype=torch.bfloat16)
        want = ops.silu_and_mul.native(x)
        compiled(x)
        t_compile = timing.device_median_us(lambda x=x: compiled(x), platform, rep_ms=50)
        default = chosen(t, inter)
        print(
            json.dumps({"inter": inter, "compile_us": round(t_compile, 2), "default": default}),
            flush=True,
        )
        for block_c in (1024, 2048, 4096):
            for rows in (1, 2, 4):
                for warps in (2, 4, 8, 16):
                    params = (block_c, rows, warps)
                    _launch.elementwise_params = lambda *a, p=params: p  # noqa: E731
                    try:
                        ok = torch.allclose(
                            activation.silu_and_mul(x).float(), want.float(), atol=2e-2, rtol=2e-2
                        )
                        us = timing.device_median_us(
                            lambda x=x: activation.silu_and_mul(x), platform, rep_ms=50
                        )
                    finally:
                        _launch.elementwise_params = chosen
                    row = {
                        "inter": inter,
                        "tokens": t,
                        "block_c": block_c,
                        "rows": rows,
                        "warps": warps,
                        "us": round(us, 2),
                        "vs_compile": round(us / t_compile, 4),
                        "ok": ok,
                        "default": params == default,
                    }
                    rows_out.append(row)
                    print(json.dumps(row), flush=True)
    if args.out:
        write_json(
            {
                "device": torch.cuda.get_device_name(dev),
                "torch": torch.__version__,
                "rows": rows_out,
            },
            os.path.join(args.out, "sweep_activations.json"),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
