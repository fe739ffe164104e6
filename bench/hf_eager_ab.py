"""Eager decode of a Hugging Face model, HF against opcore-patched, interleaved in one process.

An eager decode step of a small model is host-bound (the host issues the step while the GPU
waits), and host time moves between processes by more than the difference between the two
configurations: on the H200 of 2026-12-01 the same HF Llama step measured 2.17 ms in one
run and 3.15 ms in another. `bench/hf_models.py` measures each configuration in its own
process; this script measures HF and opcore on one model in one process, alternating:
each round times ``--steps`` decode steps unpatched, then patched with
`opcore.integrations.transformers.apply` (reverted after the round), the order swapped every
round. The verdict is the per-round ratio opcore / hf (median and range over the rounds),
which the process's own drift cannot bias.

Same model, shapes and step as `bench/hf_models.py` (``--layers`` decoder layers of the
Llama-3-8B or Qwen3-8B shape, random weights, bf16, one token per sequence after a
``--prompt``-token prompt, each step timed with device events). Caches: DynamicCache with
SDPA's cuDNN backend disabled (cuDNN builds a plan per new KV length: see the module
docstring of `bench/hf_models.py`), then a StaticCache (no graphs). Liger is not in the
interleave: it patches transformers' modules and has no revert.

    python bench/hf_eager_ab.py --models llama3-8b,qwen3-8b --out DIR     (GPU)
    python bench/hf_eager_ab.py --tiny                                     (CPU plumbing)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from opcore.bench.report import write_json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hf_models  # noqa: E402  (the sibling benchmark: model shapes, the timed step)


def _round(bench, batch: int, patched: bool) -> tuple[float, bool]:
    """Median decode step (ms) of one pass, with the model patched or not, and whether the
    model was patched during the pass (it is reverted after it)."""
    import contextlib

    from opcore.integrations.transformers import is_patched
    from opcore.integrations.transformers import patched as patching

    with patching(bench.model) if patched else contextlib.nullcontext():
        was = is_patched(bench.model)
        return bench.decode(batch)["decode_step_ms_median"], was


def measure(model: str, args) -> list[dict]:
    import torch

    child = hf_models.parse_args(
        ["--_child", "--model", model, "--config", "hf", "--layers", str(args.layers),
         "--prompt", str(args.prompt), "--steps", str(args.steps),
         "--warm-steps", str(args.warm_steps), "--dtype", args.dtype, "--device", args.device]
    )  # fmt: skip
    child.batch = [int(b) for b in args.batch.split(",")]
    if child.device == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
    bench = hf_models.Bench(child)
    rows = []
    with torch.inference_mode():
        for cache in ("dynamic", "static"):
            bench.static = cache == "static"
            for batch in child.batch:
                _round(bench, batch, False)  # warm both forms (kernels, caches, allocator)
                _round(bench, batch, True)
                times: dict[str, list[float]] = {"hf": [], "opcore": []}
                forms: dict[str, set[bool]] = {"hf": set(), "opcore": set()}
                for r in range(args.rounds):
                    order = (False, True) if r % 2 == 0 else (True, False)
                    for patched in order:
                        name = "opcore" if patched else "hf"
                        ms, was = _round(bench, batch, patched)
                        times[name].append(ms)
                        forms[name].add(was)
                ratios = [o / h for o, h in zip(times["opcore"], times["hf"], strict=True)]
                row = {
                    "model": model,
                    "cache": cache,
                    "batch": batch,
                    "rounds": args.rounds,
                    "hf_ms": times["hf"],
                    "opcore_ms": times["opcore"],
                    "hf_ms_median": statistics.median(times["hf"]),
                    "opcore_ms_median": statistics.median(times["opcore"]),
                    "ratio_median": statistics.median(ratios),
                    "ratio_min": min(ratios),
                    "ratio_max": max(ratios),
                    # the model was patched in every opcore pass and in no hf pass
                    "forms_as_labelled": forms == {"hf": {False}, "opcore": {True}},
                }
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def markdown(env: dict, rows: list[dict]) -> str:
    lines = [
        "# Eager decode, HF vs opcore-patched, interleaved in one process",
        "",
        ", ".join(f"{k}: {v}" for k, v in env.items()),
        "",
        "Per round: the median decode step of one pass of each form; ratio = opcore / hf of "
        "the same round (below 1: opcore faster).",
        "",
        "| model | cache | batch | rounds | hf ms (median) | opcore ms (median) "
        "| ratio median | ratio range | opcore faster in |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        wins = sum(o < h for o, h in zip(r["opcore_ms"], r["hf_ms"], strict=True))
        lines.append(
            f"| {r['model']} | {r['cache']} | {r['batch']} | {r['rounds']} | "
            f"{r['hf_ms_median']:.3f} | {r['opcore_ms_median']:.3f} | {r['ratio_median']:.3f} "
            f"| {r['ratio_min']:.3f}-{r['ratio_max']:.3f} | {wins}/{r['rounds']} rounds |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="llama3-8b,qwen3-8b")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", default="1,32")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--steps", type=int, default=64, help="timed decode steps per pass")
    p.add_argument("--warm-steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="CPU plumbing check: tiny models")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.tiny:
        args.models, args.layers, args.batch, args.prompt = "tiny-llama,tiny-qwen3", 1, "1,2", 8
        args.steps, args.warm_steps, args.rounds, args.dtype, args.device = 4, 1, 2, "fp32", "cpu"
    env = hf_models.environment(args.device)
    env["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    env["layers"], env["steps per pass"] = args.layers, args.steps
    rows: list[dict] = []
    for model in args.models.split(","):
        rows += measure(model, args)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            write_json(
                {"environment": env, "rows": rows}, os.path.join(args.out, "hf_eager_ab.json")
            )
            with open(os.path.join(args.out, "hf_eager_ab.md"), "w") as f:
                f.write(markdown(env, rows))
    print(markdown(env, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
