"""Hugging Face transformers models through opcore against HF eager, Liger and torch.compile.

Models: Llama-3-8B and Qwen3-8B layer shapes (``--layers`` of their decoder layers, random
weights, bf16), built from their config classes (nothing is downloaded). Five
configurations, each in its own child process (Liger patches transformers' modules
globally, and compiled state must not leak between them):

1. ``hf``: transformers eager, DynamicCache.
2. ``liger``: ``apply_liger_kernel_to_llama`` / ``_qwen3`` (RMSNorm, SwiGLU, RoPE) on the
   model, eager, DynamicCache.
3. ``compile``: ``torch.compile`` of the model; decode with a StaticCache and
   ``mode="reduce-overhead"`` (Inductor's CUDA graphs), as transformers' own compile path.
4. ``opcore``: ``opcore.integrations.transformers.apply(model)``, eager, DynamicCache.
5. ``opcore-compile``: patched, then ``torch.compile`` with the opcore backend (Inductor,
   ``triton.cudagraphs``); decode with a StaticCache.

``--eager-static`` adds, for the eager configurations, decode on a StaticCache (no graphs).

Measured per configuration and batch: prefill (one forward of ``batch x --prefill``
tokens into an empty cache, logits of the last token only) and decode (``--steps`` steps
of one token per sequence after a ``--prompt``-token prefill), each step timed with device
events; tokens/s = tokens / time. ``--profile`` adds each configuration's top kernels over
``--profile-steps`` decode steps (torch.profiler), the breakdown behind the gaps.

Run on a GPU machine (torch 2.11, transformers 5.17, liger-kernel 0.8.5):

    python bench/hf_models.py --layers 4 --batch 1,32 --prefill 2048 --prompt 512 --steps 128 \\
        --out bench/results/<date>-h200-hf-models

Writes ``hf_models.json`` and ``hf_models.md`` in ``--out``. ``--shape tiny --device cpu``
runs small shapes on the CPU (a smoke test of the script; its timings mean nothing).
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time

CONFIGS = ("hf", "liger", "compile", "opcore", "opcore-compile")
GRAPHED = ("compile", "opcore-compile")

# Layer shapes of the released models (config.json of meta-llama/Meta-Llama-3-8B and
# Qwen/Qwen3-8B); num_hidden_layers comes from --layers.
SHAPES = {
    "llama3-8b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "qwen3-8b": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # CPU smoke test of this script
    "tiny-llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, vocab_size=512, max_position_embeddings=1024)),
    "tiny-qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, vocab_size=512, max_position_embeddings=1024)),
}  # fmt: skip
MODEL_SETS = {"8b": ("llama3-8b", "qwen3-8b"), "tiny": ("tiny-llama", "tiny-qwen3")}


# --------------------------------------------------------------------------- child
def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


class _Timer:
    """Device-event timing on CUDA, wall time elsewhere (milliseconds)."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self.device = device
        if self.cuda:
            self.start, self.end = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )

    def __enter__(self):
        if self.cuda:
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            self.ms = self.start.elapsed_time(self.end)
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3


def build_model(shape: str, layers: int, device, dtype):
    import torch
    import transformers

    config_name, model_name, opts = SHAPES[shape]
    config = getattr(transformers, config_name)(num_hidden_layers=layers, **opts)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, model_name)(config)
    return model.to(dtype).eval()


def _cache_kw(model) -> str:
    # transformers 5.17 names the argument past_key_values; later versions cache
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def prepare(config: str, model, device):
    """Apply ``config`` to ``model``; returns (forward callable, uses a static cache)."""
    import torch

    if config == "liger":
        import liger_kernel.transformers as lk

        fn = (
            lk.apply_liger_kernel_to_llama
            if model.config.model_type == "llama"
            else lk.apply_liger_kernel_to_qwen3
        )
        fn(
            rope=True,
            rms_norm=True,
            swiglu=True,
            cross_entropy=False,
            fused_linear_cross_entropy=False,
            model=model,
        )
        return model, False
    if config == "compile":
        return torch.compile(
            model, mode="reduce-overhead" if device.type == "cuda" else None, fullgraph=True
        ), True
    if config in ("opcore", "opcore-compile"):
        import opcore.integrations.transformers as oh

        patch = oh.apply(model)
        print(patch, file=sys.stderr)
        if config == "opcore":
            return model, False
        import opcore.compile as oc

        inductor = {"triton.cudagraphs": True} if device.type == "cuda" else None
        return torch.compile(
            model, backend=oc.backend(mode="inductor", inductor_config=inductor), fullgraph=True
        ), True
    return model, False


def run_child(args) -> dict:
    import torch
    import transformers
    from transformers import DynamicCache, StaticCache

    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    model = build_model(args.model, args.layers, device, dtype)
    fwd, static = prepare(args.config, model, device)
    static = static or args.static_cache
    kw = _cache_kw(model)
    vocab = model.config.vocab_size
    g = torch.Generator(device=device).manual_seed(1)
    result = {
        "model": args.model,
        "config": args.config,
        "cache": "static" if static else "dynamic",
        "rows": [],
    }

    def new_cache(batch, length):
        if static:
            return StaticCache(config=model.config, max_cache_len=length)
        return DynamicCache(config=model.config)

    graphed = args.config in GRAPHED and device.type == "cuda"

    def forward(ids, cache, start, compiled=True):
        pos = torch.arange(start, start + ids.shape[1], device=device)[None].expand(
            ids.shape[0], -1
        )
        if graphed and compiled:  # a new step for Inductor's CUDA graph trees (as generate does)
            torch.compiler.cudagraph_mark_step_begin()
        call = fwd if compiled else model
        return call(
            input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1, **{kw: cache}
        ).logits

    with torch.inference_mode():
        for batch in args.batch:
            row = {"batch": batch}
            # prefill: one forward of batch x prefill tokens into an empty cache
            ids = torch.randint(0, vocab, (batch, args.prefill), device=device, generator=g)
            times = []
            for i in range(args.warmup + args.repeats):
                cache = new_cache(batch, args.prefill)
                _sync(device)
                with _Timer(device) as t:
                    forward(ids, cache, 0)
                if i >= args.warmup:
                    times.append(t.ms)
                del cache
            row["prefill_ms"] = statistics.median(times)
            row["prefill_tok_s"] = batch * args.prefill / (row["prefill_ms"] / 1e3)
            # decode: prompt, then steps of one token per sequence
            prompt = torch.randint(0, vocab, (batch, args.prompt), device=device, generator=g)
            steps = []
            for rep in range(2):  # the first pass compiles / records graphs
                cache = new_cache(batch, args.prompt + args.steps + 1)
                # The prompt runs uncompiled, as in transformers' generate: it allocates the
                # static cache outside the CUDA graphs that then update it in place.
                logits = forward(prompt, cache, 0, compiled=not graphed)
                nxt = logits[:, -1:].argmax(-1)
                _sync(device)
                for s in range(args.steps):
                    with _Timer(device) as t:
                        logits = forward(nxt, cache, args.prompt + s)
                        nxt = logits[:, -1:].argmax(-1)
                    if rep == 1:
                        steps.append(t.ms)
                del cache
            row["decode_step_ms_median"] = statistics.median(steps)
            row["decode_step_ms_mean"] = statistics.fmean(steps)
            row["decode_tok_s"] = batch / (row["decode_step_ms_median"] / 1e3)
            if args.profile and device.type == "cuda":
                row["profile"] = profile_decode(forward, new_cache, batch, args, device, vocab, g)
            result["rows"].append(row)
            print(json.dumps(row), file=sys.stderr)
    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    if args.config.startswith("opcore"):
        from opcore.integrations.transformers import OPS
        from opcore.ir import ops

        # which providers the patched model's ops try, in order (the platform's default)
        result["opcore_priority"] = {name: getattr(ops, name).effective_priority() for name in OPS}
    return result


def profile_decode(forward, new_cache, batch, args, device, vocab, g) -> list[dict]:
    """Top kernels (device time) over ``--profile-steps`` decode steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    prompt = torch.randint(0, vocab, (batch, args.prompt), device=device, generator=g)
    cache = new_cache(batch, args.prompt + args.profile_steps + 1)
    nxt = forward(prompt, cache, 0, compiled=False)[:, -1:].argmax(-1)
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for s in range(args.profile_steps):
            nxt = forward(nxt, cache, args.prompt + s)[:, -1:].argmax(-1)
        _sync(device)
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)[:25]:
        rows.append({
            "name": e.key[:90], "calls_per_step": e.count / args.profile_steps,
            "device_us_per_step": e.device_time_total / args.profile_steps,
            "cpu_us_per_step": e.cpu_time_total / args.profile_steps,
        })  # fmt: skip
    return rows


# --------------------------------------------------------------------------- parent
def environment(device: str) -> dict:
    import torch

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
    }  # fmt: skip
    for mod in ("transformers", "liger_kernel", "triton"):
        try:
            from importlib.metadata import version

            env[mod] = version(mod.replace("_", "-"))
        except Exception:  # noqa: BLE001  (not installed: say so)
            env[mod] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(0)
        env["driver_cuda"] = torch.version.cuda
    else:
        env["device"] = platform.processor() or "cpu"
    try:
        env["opcore_git"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
            timeout=10,
        ).stdout.strip()
    except Exception:  # noqa: BLE001
        env["opcore_git"] = None
    return env


def markdown(env: dict, args, results: list[dict]) -> str:
    lines = [
        f"# HF models: opcore vs HF eager, Liger, torch.compile ({env['device']})",
        "",
        f"{env['date']}; torch {env['torch']}, transformers {env['transformers']}, "
        f"liger-kernel {env['liger_kernel']}, triton {env['triton']}, "
        f"opcore {env['opcore_git']}. {args.layers} decoder layers, random weights, "
        f"{args.dtype}; prefill = one forward of batch x {args.prefill} tokens; decode = per "
        f"step after a {args.prompt}-token prompt, median of {args.steps} steps. `compile` and "
        "`opcore-compile` decode on a StaticCache with CUDA graphs (the prompt runs uncompiled, "
        "as in transformers' generate); the others on a DynamicCache, eagerly (unless the cache "
        "column says static).",
        "",
        "| model | config | cache | batch | prefill ms | prefill tok/s | decode step ms "
        "| decode tok/s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['config']} | | | failed: {r['error'][:120]} | | | |")
            continue
        for row in r["rows"]:
            lines.append(
                f"| {r['model']} | {r['config']} | {r['cache']} | {row['batch']} | "
                f"{row['prefill_ms']:.2f} | {row['prefill_tok_s']:.0f} | "
                f"{row['decode_step_ms_median']:.3f} | {row['decode_tok_s']:.0f} |"
            )
    for r in results:
        for row in r.get("rows", []):
            if row.get("profile"):
                lines += [
                    "",
                    f"## Decode profile: {r['model']} {r['config']} batch {row['batch']} "
                    "(per step)",
                    "",
                    "| kernel / op | calls | device us | cpu us |",
                    "|---|---:|---:|---:|",
                ]
                lines += [
                    f"| `{p['name']}` | {p['calls_per_step']:.1f} | "
                    f"{p['device_us_per_step']:.1f} | {p['cpu_us_per_step']:.1f} |"
                    for p in row["profile"]
                ]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(MODEL_SETS), default="8b")
    p.add_argument("--models", default=None, help="comma list of " + ", ".join(SHAPES))
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", default="1,32")
    p.add_argument("--prefill", type=int, default=2048)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--eager-static", action="store_true", help="also decode the eager configs on a StaticCache"
    )
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-steps", type=int, default=20)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per configuration")
    p.add_argument("--out", default=None)
    p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--static-cache", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.batch = [int(b) for b in str(args.batch).split(",")]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args._child:
        print(json.dumps(run_child(args)))
        return 0
    models = args.models.split(",") if args.models else MODEL_SETS[args.shape]
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS] + [m for m in models if m not in SHAPES]
    if unknown:
        raise SystemExit(
            f"unknown configs/models {unknown}; configs: {CONFIGS}; models: {list(SHAPES)}"
        )
    runs = [(m, c, False) for m in models for c in configs]
    if args.eager_static:
        runs += [(m, c, True) for m in models for c in configs if c not in GRAPHED]
    common = ["--layers", str(args.layers), "--batch", ",".join(map(str, args.batch)),
              "--prefill", str(args.prefill), "--prompt", str(args.prompt),
              "--steps", str(args.steps), "--warmup", str(args.warmup),
              "--repeats", str(args.repeats), "--dtype", args.dtype, "--device", args.device,
              "--profile-steps", str(args.profile_steps)]  # fmt: skip
    common += ["--profile"] if args.profile else []
    results = []
    for model, config, static in runs:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--_child",
            "--model",
            model,
            "--config",
            config,
            *common,
        ]
        if static:
            cmd.append("--static-cache")
        print(f"== {model} {config}{' static' if static else ''}", flush=True)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            if proc.returncode:
                results.append(
                    {
                        "model": model,
                        "config": config,
                        "error": proc.stderr.strip().splitlines()[-1]
                        if proc.stderr.strip()
                        else f"exit {proc.returncode}",
                        "stderr": proc.stderr[-4000:],
                    }
                )
            else:
                results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        except subprocess.TimeoutExpired:
            results.append(
                {"model": model, "config": config, "error": f"timed out after {args.timeout:.0f} s"}
            )
        r = results[-1]
        print(
            r.get("error")
            or "\n".join(
                json.dumps({k: v for k, v in row.items() if k != "profile"}) for row in r["rows"]
            ),
            flush=True,
        )
    env = environment(args.device)
    report = {
        "environment": env,
        "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "results": results,
    }
    md = markdown(env, args, results)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "hf_models.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(args.out, "hf_models.md"), "w") as f:
            f.write(md)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
