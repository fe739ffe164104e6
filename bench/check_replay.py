"""The per-call fast path on a device: every op sample called twice through the op, the
second call served by what the first bound (a Triton provider's replay), must give the
same bits as the first, on fresh copies of the inputs (same values and layouts, other
addresses).

    python bench/check_replay.py [--full] [--out DIR]

Prints one line per op and dtype (samples, how many were served by a bound replay, how
many differed) and exits 1 when any differed.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from opcore.bench.report import write_json
from opcore.ir import all_ops
from opcore.platforms import get_current_platform

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point():
            return torch.equal(a.float().nan_to_num(7.0), b.float().nan_to_num(7.0)) and bool(
                (a.float().isnan() == b.float().isnan()).all()
            )
        return torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="the full sample set (default quick)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    plat = get_current_platform()
    device = plat.device()
    rows, bad = [], 0
    for name, op in all_ops().items():
        for dtype in DTYPES:
            n = replayed = differ = 0
            errors: list[str] = []
            for first, second in zip(
                op.sample_inputs(device, dtype, quick=not a.full),
                op.sample_inputs(device, dtype, quick=not a.full),
                strict=True,
            ):
                try:
                    before = len(op.route().bound)
                    r1 = op(*first.args, **first.kwargs)
                    fn = None
                    if len(op.route().bound) == before + 1:
                        fn = list(op.route().bound.values())[-1]
                    r2 = op(*second.args, **second.kwargs)
                    plat.synchronize()
                except Exception as exc:  # a sample the op refuses: not this check's subject
                    errors.append(f"{first.name}: {type(exc).__name__}")
                    continue
                n += 1
                if fn is not None and getattr(fn, "__wrapped__", None) is not None:
                    replayed += 1
                if not _equal(r1, r2):
                    differ += 1
                    errors.append(f"{first.name}: replay differs")
            bad += differ
            row = {
                "op": name,
                "dtype": str(dtype).removeprefix("torch."),
                "provider": op.effective_priority()[0],
                "samples": n,
                "replayed": replayed,
                "differ": differ,
                "notes": errors[:5],
            }
            rows.append(row)
            print(
                f"{name:40s} {row['dtype']:9s} {row['provider']:10s} samples {n:3d} "
                f"replayed {replayed:3d} differ {differ}" + (f"  {errors[:3]}" if errors else ""),
                flush=True,
            )
    print("verdict:", "REPLAYS DIFFER" if bad else "every replay equals its full path")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        write_json(rows, os.path.join(a.out, "check_replay.json"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
