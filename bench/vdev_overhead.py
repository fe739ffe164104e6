"""Per-call cost of the virtual device (`opcore.vdev`) against the CPU, on tiny tensors.

The virtual device computes with torch's CPU kernels behind one Python fallback, so on
small tensors its cost is the fallback's: mapping arguments to host views, the CPU
kernel, mapping results back (and for a functional op torch calls it twice: ``empty`` and
the ``.out`` kernel). Measured for ``x + y``, ``x.mul_(2)``, a view (``x[1:]``), a copy to
the CPU, and ``ops.rms_norm`` (native and the ``vdev`` provider's math).

Timing: ``timeit``, best of ``--repeat`` rounds of ``--number`` calls, by the thread's CPU
time (``time.thread_time``) so other processes on a shared machine do not inflate it.

    python bench/vdev_overhead.py [--number 2000] [--repeat 7] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
import timeit

import torch

from opcore import vdev
from opcore.ir import ops


def _best(fn, number: int, repeat: int) -> float:
    timer = timeit.Timer(fn, timer=time.thread_time)
    return min(timer.repeat(repeat=repeat, number=number)) / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--markdown", metavar="FILE")
    args = parser.parse_args()

    vdev.install()
    torch.set_num_threads(1)
    rows = []
    for device in ("cpu", "vdev"):
        x, y = torch.randn(8, 64, device="cpu").to(device), torch.randn(8, 64).to(device)
        w = torch.randn(64).to(device)
        cases = {
            "x + y": lambda x=x, y=y: x + y,
            "x.mul_(2)": lambda x=x: x.mul_(2),
            "x[1:] (view)": lambda x=x: x[1:],
            "x.cpu()": lambda x=x: x.cpu(),
            "ops.rms_norm (native)": lambda x=x, w=w: ops.rms_norm.native(x, w, 1e-6),
        }
        for name, fn in cases.items():
            fn()
            rows.append((name, device, _best(fn, args.number, args.repeat) * 1e6))
    cpu = {name: us for name, dev, us in rows if dev == "cpu"}
    lines = [
        f"# vdev per-call cost ({datetime.date.today()}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, 1 thread, CPU time)",
        "",
        "| call | cpu (us) | vdev (us) | ratio |",
        "|---|---:|---:|---:|",
    ]
    for name, dev, us in rows:
        if dev == "vdev":
            lines.append(f"| `{name}` | {cpu[name]:.1f} | {us:.1f} | {us / cpu[name]:.0f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
