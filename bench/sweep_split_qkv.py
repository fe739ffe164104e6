"""Launch-shape sweep for the triton `split_qkv_rmsnorm_rope` at many tokens (a GPU tool).

The kernel's grid is ``(tokens, splits)``: each program takes ``BLOCK_Q`` q heads and
``BLOCK_KV`` k/v heads of one token (`opcore.kernels.triton._launch.split_qkv_params`,
which the launcher calls and this replaces for each variant).
This times every ``splits x num_warps`` choice on the bench's shapes, checks each against
the native op, and prints % of copy bandwidth (bytes as `opcore bench` counts them):

    PYTHONPATH=sdk/src python bench/sweep_split_qkv.py [--tokens 32768] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from opcore.bench import timing
from opcore.bench.report import write_json
from opcore.ir import ops
from opcore.kernels.triton import _launch, qk_norm_rope
from opcore.platforms import get_current_platform


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    platform = get_current_platform()  # its timing events time the kernels
    copy = timing.copy_bandwidth_gbs(platform)
    chosen = _launch.split_qkv_params
    rows = []
    print(
        f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}; copy {copy:.0f} GB/s",
        flush=True,
    )
    for hq, hkv, d in ((32, 8, 128), (64, 8, 128)):
        t = args.tokens
        g = torch.Generator(device="cpu").manual_seed(0)
        qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).to(dev, torch.bfloat16)
        qw = torch.randn(d, generator=g).to(dev, torch.bfloat16)
        kw = torch.randn(d, generator=g).to(dev, torch.bfloat16)
        pos = torch.randint(0, 8192, (t,), generator=g).to(dev)
        cache = torch.randn(8192, d, generator=g).to(dev)
        call = (qkv, qw, kw, 1e-6, pos, cache, hq, hkv, d, True)
        nbytes = 2 * t * (hq + 2 * hkv) * d * 2 + t * (d * 4 + 8)
        want = ops.split_qkv_rmsnorm_rope.native(*call)
        default = chosen(t, hq, hkv, d)
        for splits in (1, 2, 4, 8):
            if hkv % splits:
                continue
            for warps in (2, 4, 8, 16):
                params = (
                    splits,
                    _launch.next_pow2(hq // splits),
                    _launch.next_pow2(hkv // splits),
                    warps,
                )
                _launch.split_qkv_params = lambda *a, p=params: p  # noqa: E731
                try:
                    got = qk_norm_rope.split_qkv_rmsnorm_rope(*call)
                    ok = all(
                        torch.allclose(a.float(), b.float(), atol=3e-2, rtol=3e-2)
                        for a, b in zip(got, want, strict=True)
                    )
                    us = timing.device_median_us(
                        lambda c=call: qk_norm_rope.split_qkv_rmsnorm_rope(*c), platform, rep_ms=50
                    )
                finally:
                    _launch.split_qkv_params = chosen
                gbs = nbytes / us / 1e3
                row = {
                    "heads": f"{hq}/{hkv}x{d}",
                    "tokens": t,
                    "splits": splits,
                    "warps": warps,
                    "block_q": params[1],
                    "block_kv": params[2],
                    "us": round(us, 2),
                    "pct_copy": round(100 * gbs / copy, 1),
                    "ok": ok,
                    "default": params == default,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        write_json(
            {
                "copy_gbs": copy,
                "device": torch.cuda.get_device_name(dev),
                "torch": torch.__version__,
                "rows": rows,
            },
            os.path.join(args.out, "sweep_split_qkv.json"),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
