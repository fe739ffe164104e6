"""Cost of platform resolution on top of `import torch`, in cold processes.

Each sample is a fresh interpreter that imports torch, then times `import opcore.platforms`
plus the first `get_current_platform()` (entry-point scan, every probe, class import).
Reports the median over N processes. Target (docs/design.md#performance-targets): < 30 ms.

    python bench/resolution_cold_start.py [-n 15]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys

CHILD = r"""
import time, json
import torch
t0 = time.perf_counter()
import opcore.platforms as p
plat = p.get_current_platform()
t1 = time.perf_counter()
print(json.dumps({"ms": (t1 - t0) * 1e3, "platform": plat.name,
                  "candidates": [c.name for c in p.explain().candidates]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=15)
    args = parser.parse_args()
    samples, last = [], None
    for _ in range(args.n):
        out = subprocess.run(
            [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True
        )
        last = json.loads(out.stdout.strip().splitlines()[-1])
        samples.append(last["ms"])
    import torch

    print(
        json.dumps(
            {
                "median_ms": round(statistics.median(samples), 2),
                "min_ms": round(min(samples), 2),
                "max_ms": round(max(samples), 2),
                "n": args.n,
                "platform": last["platform"],
                "candidates": last["candidates"],
                "python": platform.python_version(),
                "torch": torch.__version__,
                "cpu": platform.processor() or platform.machine(),
                "date": datetime.date.today().isoformat(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
