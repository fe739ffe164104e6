"""Per-call cost of a compiled model's staleness guard (`opcore.compile.backend.CompiledGraph`).

A graph compiled by `opcore.compile` checks on each call whether what its cache key is made
of (the provider registry, the `set_priority` blocks in force) changed since it was
compiled. This script times one call of a tiny compiled model (``rms_norm`` then
``silu_and_mul`` on a [1, 16] tensor, ``mode="eager"`` so no code generation is timed) in
the situations that used to make the guard recompute the whole cache key (hashing the
pipeline's module sources, ~5 ms) although nothing the key is made of had changed:

1. a plain call (the guard's fast path);
2. each call inside its own ``with set_current_config(cfg):`` block (``cfg`` the current
   config, as a server that sets the config per request does);
3. each call inside its own ``with ops.rms_norm.set_priority(<its effective priority>):``;
4. each call after ``opcore.ir.invalidate_caches()`` (a registry-generation bump with no
   change to any provider).

The with-blocks and the bump are timed alone too; the table's "guard" column is the call's
time minus the plain call and minus that block's own cost. The script checks that no case
recompiled the graph (the number of compile records stays 1).

Timing: best of ``--repeat`` rounds of ``--number`` calls, thread CPU time.

    python bench/compile_guard.py [--number 2000] [--repeat 7] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
import timeit

import torch

import opcore
import opcore.compile as oc
from opcore.ir import invalidate_caches, ops
from opcore.settings import get_current_config, set_current_config

TIMER = time.thread_time


def model(x, w):
    return ops.silu_and_mul(ops.rms_norm(x, w, 1e-6))


def _best(fn, number: int, repeat: int) -> float:
    return min(timeit.timeit(fn, number=number, timer=TIMER) / number for _ in range(repeat))


def measure(number: int, repeat: int) -> tuple[list[dict], int]:
    torch.set_num_threads(1)
    x, w = torch.randn(1, 16), torch.rand(16) + 0.5
    compiled = oc.compile(model, mode="eager")
    with torch.inference_mode():
        compiled(x, w)  # compile
        compiled(x, w)
    backend = compiled.opcore_backend
    cfg = get_current_config()
    prio = ops.rms_norm.effective_priority()

    def in_config():
        with set_current_config(cfg):
            compiled(x, w)

    def config_block():
        with set_current_config(cfg):
            pass

    def in_priority():
        with ops.rms_norm.set_priority(prio):
            compiled(x, w)

    def priority_block():
        with ops.rms_norm.set_priority(prio):
            pass

    def after_bump():
        invalidate_caches()
        compiled(x, w)

    rows = []
    with torch.inference_mode():
        plain = _best(lambda: compiled(x, w), number, repeat)
        rows.append(
            {"case": "plain call", "call_us": plain * 1e6, "alone_us": 0.0, "guard_us": None}
        )
        for name, fn, alone in (
            ("each call in its own set_current_config(cfg) block", in_config, config_block),
            (
                "each call in its own rms_norm.set_priority(<effective>) block",
                in_priority,
                priority_block,
            ),
            ("each call after invalidate_caches()", after_bump, invalidate_caches),
        ):
            t = _best(fn, number, repeat)
            t_alone = _best(alone, number, repeat)
            rows.append(
                {
                    "case": name,
                    "call_us": t * 1e6,
                    "alone_us": t_alone * 1e6,
                    "guard_us": (t - t_alone - plain) * 1e6,
                }
            )
    return rows, len(backend.records)


def environment() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "machine": f"{cpu}, {torch.get_num_threads()} torch thread(s)",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "opcore": opcore.__version__,
    }


def to_markdown(
    rows: list[dict], records: int, env: dict[str, str], number: int, repeat: int
) -> str:
    lines = ["# Compiled-graph staleness guard, per call", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += [
        f"- method: `python bench/compile_guard.py --number {number} --repeat {repeat}`; "
        "best of the rounds, thread CPU time; graphs compiled during the run: "
        f"{records} (1 = no recompilation)",
        "",
    ]
    lines += [
        "| case | call (us) | block alone (us) | guard beyond a plain call (us) |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        guard = "" if r["guard_us"] is None else f"{r['guard_us']:.2f}"
        lines.append(f"| {r['case']} | {r['call_us']:.2f} | {r['alone_us']:.2f} | {guard} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args(argv)
    rows, records = measure(args.number, args.repeat)
    text = to_markdown(rows, records, environment(), args.number, args.repeat)
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    return 0 if records == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
