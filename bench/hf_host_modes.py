"""The graphed decode step's host time, per CPU the process runs on.

On the H200 the host's dispatch of a compiled, CUDA-graphed decode step (Dynamo's guards,
the graph-tree wrapper, the input copies; `bench/hf_models.py` configurations ``compile``
and ``opcore-compile``) took either about 0.3 ms or about 0.6 ms per step, and which one
changed between processes and batch sizes, not with the configuration
(bench/results/2026-12-01-h200-hf/). This script compiles one configuration once, then
times ``--passes`` decode passes pinned to each CPU in ``--cpus`` in turn
(`os.sched_setaffinity`) and once on all of them, recording per pass the median step time
and host time: if the two modes follow the CPU, the cause is where the process runs, not
what it runs.

    python bench/hf_host_modes.py --model qwen3-8b --config opcore-compile --out DIR   (GPU)
    python bench/hf_host_modes.py --tiny                                                (CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hf_models  # noqa: E402  (the sibling benchmark: model shapes, the timed step)


def passes(bench, batch: int, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        row = bench.decode(batch)
        out.append({k: row[k] for k in ("decode_step_ms_median", "decode_host_ms_median")})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--config", default="opcore-compile", choices=hf_models.CONFIGS)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per pass")
    p.add_argument("--passes", type=int, default=3, help="passes per CPU setting")
    p.add_argument("--cpus", default=None, help="comma list (default: every 4th CPU)")
    p.add_argument("--tiny", action="store_true", help="CPU plumbing check")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    model, device, dtype, prompt = args.model, "cuda", "bf16", "512"
    if args.tiny:
        model, device, dtype, prompt, args.layers = "tiny-qwen3", "cpu", "fp32", "8", 1
        args.steps, args.passes, args.batch = 3, 1, 2
    allowed = sorted(os.sched_getaffinity(0))
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else allowed[::4]
    child = hf_models.parse_args(
        ["--_child", "--model", model, "--config", args.config, "--layers", str(args.layers),
         "--prompt", prompt, "--steps", str(args.steps), "--warm-steps", "2",
         "--dtype", dtype, "--device", device]
    )  # fmt: skip
    child.batch = [args.batch]
    import torch

    t0 = time.perf_counter()
    bench = hf_models.Bench(child)
    with torch.inference_mode():
        passes(bench, args.batch, 1)  # compile and record the graphs
        ready_s = time.perf_counter() - t0
        graphs = hf_models._graph_count(torch)
        results = []
        for setting in [None, *cpus, None]:
            os.sched_setaffinity(0, allowed if setting is None else {setting})
            rows = passes(bench, args.batch, args.passes)
            host = [r["decode_host_ms_median"] for r in rows]
            step = [r["decode_step_ms_median"] for r in rows]
            results.append({"cpu": "all" if setting is None else setting,
                            "host_ms": host, "step_ms": step,
                            "host_ms_median": statistics.median(host),
                            "step_ms_median": statistics.median(step)})  # fmt: skip
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        os.sched_setaffinity(0, allowed)
    report = {
        "environment": hf_models.environment(device),
        "model": model,
        "config": args.config,
        "batch": args.batch,
        "ready_s": ready_s,
        "graphs_compiled_while_measuring": hf_models._graph_count(torch) - graphs,
        "results": results,
    }
    text = json.dumps(report, indent=1)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = f"host_modes-{model}-{args.config}-b{args.batch}.json"
        with open(os.path.join(args.out, name), "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
