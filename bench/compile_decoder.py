"""The small decoder compiled three ways, at decode and prefill shapes.

Variants (same weights, same inputs):
  ``torch.compile``       the decoder written with the ops' native functions, plain
                          ``torch.compile`` (Inductor sees only aten ops);
  ``opcore``              the decoder written with `opcore.ir` ops, `opcore.compile` in
                          ``inductor`` mode without fusion: each op lowered to the provider
                          the platform's inductor-mode priority picks;
  ``opcore+fusion``       the same with the fusion passes (add + RMSNorm ->
                          ``fused_add_rms_norm``; split QKV + q/k RMSNorm + RoPE ->
                          ``split_qkv_rmsnorm_rope``).

Model (`opcore.compile.decoder`): Llama-3-8B layer shapes (hidden 4096, 32 q / 8 kv heads of
128, MLP 14336), 8 layers, QK-norm as in Qwen3 (so the QKV fusion has something to fuse),
SDPA attention over a fixed KV context at decode (the same in all variants). ``--small``
uses tiny shapes (for the CPU). On a GPU every variant runs with Inductor's CUDA graphs
(``--no-cudagraphs`` to turn them off).

Timing: per shape, warm-up, then the median of ``--repeats`` timings of ``--iters`` calls
(CUDA events around the loop on a GPU; wall clock on the CPU).

Correctness: every variant's output (the third call, after compiling and warming up) is
compared with the uncompiled decoder written with the native functions ("eager native").
A variant whose max abs difference exceeds ``rel * max(1, max|eager|)`` (``rel`` per
dtype: bf16 0.125, i.e. 16 bf16 ulps at the output's magnitude; fp16 0.016; fp32 1e-5) is
marked FAIL in the table, a FAIL line heads the report, and the script exits with status
1 after writing its results. A variant that changed its input tensors also FAILs. Per
variant the table also says whether Inductor skipped CUDA graphs (its
``cudagraph_skips`` counter moved).

On a small CPU set OMP_NUM_THREADS=1 (Inductor OpenMP kernels and matmul threads contend).

Usage:
    python bench/compile_decoder.py --out DIR [--small] [--decode 1,8,32,128]
        [--prefill 512,2048]

Writes DIR/compile_decoder.json and DIR/compile_decoder.md and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as _py_platform
import statistics
import sys
import time

import torch

from opcore.bench.report import write_json

VARIANTS = ("torch.compile", "opcore", "opcore+fusion")
# max abs diff allowed vs eager native, per unit of output magnitude (see module docstring)
REL_TOLERANCE = {torch.bfloat16: 0.125, torch.float16: 0.016, torch.float32: 1e-5}


def tolerance(reference: torch.Tensor, dtype: torch.dtype) -> float:
    return REL_TOLERANCE[dtype] * max(1.0, float(reference.abs().max()))


def _cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def environment(device: torch.device) -> dict:
    import opcore
    from opcore.platforms import get_current_platform

    env = {
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        "device": str(device),
        "torch": torch.__version__,
        "opcore": opcore.__version__,
        "python": sys.version.split()[0],
        "platform": get_current_platform().name,
        "host": _py_platform.node(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def build(variant: str, shape, context: int | None, device, dtype, cudagraphs: bool, config=None):
    import opcore.compile as oc
    from opcore.compile.decoder import Decoder

    impl = "native" if variant == "torch.compile" else "opcore"
    model = Decoder(shape, impl=impl, decode_context=context, device=device, dtype=dtype).eval()
    if variant == "torch.compile":
        return model, torch.compile(model, mode="reduce-overhead" if cudagraphs else None), None
    be = oc.backend(
        config,
        mode="inductor",
        fusion=variant == "opcore+fusion",
        inductor_config={"triton.cudagraphs": True} if cudagraphs else None,
    )
    return model, torch.compile(model, backend=be), be


def time_ms(fn, device, iters: int, repeats: int) -> float:
    cuda = device.type == "cuda"
    samples = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(end) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / iters)
    return statistics.median(samples)


def run_case(kind: str, tokens: int, args, shape, device, dtype) -> dict:
    context = args.context if kind == "decode" else None
    g = torch.Generator(device=device).manual_seed(1)
    positions = torch.randint(
        0, min(shape.max_position, 4096), (tokens,), generator=g, device=device
    )
    hidden = torch.randn(tokens, shape.hidden, generator=g, device=device).to(dtype)
    row: dict = {"kind": kind, "tokens": tokens, "context": context}
    from opcore.compile.decoder import Decoder

    eager = Decoder(shape, impl="native", decode_context=context, device=device, dtype=dtype).eval()
    with torch.inference_mode():
        reference = eager(positions, hidden).float()
    del eager
    tol = tolerance(reference, dtype)
    row["eager max_abs"] = float(reference.abs().max())
    row["tolerance"] = tol
    hidden_before, positions_before = hidden.clone(), positions.clone()
    for variant in VARIANTS:
        torch._dynamo.reset()
        model, compiled, be = build(
            variant, shape, context, device, dtype, args.cudagraphs, args.config
        )
        skips = _cudagraph_skips()
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(3):  # compile, then warm up (CUDA graph recording included)
                out = compiled(positions, hidden)
            row[f"{variant} compile_s"] = round(time.perf_counter() - t0, 2)
            out = out.float().clone()
            diff = float((out - reference).abs().max())
            row[f"{variant} max_abs_diff"] = diff
            mutated = not (
                torch.equal(hidden, hidden_before) and torch.equal(positions, positions_before)
            )
            row[f"{variant} inputs_mutated"] = mutated
            row[f"{variant} ok"] = bool(diff <= tol) and not mutated
            if mutated:  # keep the next variants' inputs right
                hidden.copy_(hidden_before)
                positions.copy_(positions_before)
            row[f"{variant} ms"] = time_ms(
                lambda c=compiled: c(positions, hidden), device, args.iters, args.repeats
            )
            row[f"{variant} cudagraphs_skipped"] = _cudagraph_skips() > skips
        if be is not None and be.last_record is not None:
            rec = be.last_record
            row[f"{variant} lowered"] = {op: sorted(set(p)) for op, p in rec.by_op().items()}
            row[f"{variant} fusions"] = rec.fusions
        del model, compiled, be
        if device.type == "cuda":
            torch.cuda.empty_cache()
    base = row["torch.compile ms"]
    for variant in VARIANTS[1:]:
        row[f"{variant} speedup"] = round(base / row[f"{variant} ms"], 3)
    return row


def failures(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        for v in VARIANTS:
            if not r[f"{v} ok"]:
                why = (
                    "wrote its inputs"
                    if r[f"{v} inputs_mutated"]
                    else (
                        f"max abs diff {r[f'{v} max_abs_diff']:.3g} > "
                        f"tolerance {r['tolerance']:.3g}"
                    )
                )
                out.append(f"{v} at {r['kind']} {r['tokens']} tokens: {why} (vs eager native)")
    return out


def _check(r: dict, v: str) -> str:
    mark = "ok" if r[f"{v} ok"] else "**FAIL**"
    extra = " (inputs written)" if r[f"{v} inputs_mutated"] else ""
    return f"{r[f'{v} max_abs_diff']:.3g} {mark}{extra}"


def markdown(env: dict, rows: list[dict], shape, dtype, cudagraphs: bool) -> str:
    failed = failures(rows)
    lines = ["# opcore.compile: small decoder compiled three ways", ""]
    if failed:
        lines += [
            f"**FAIL: {len(failed)} variant/shape(s) differ from eager native beyond tolerance:**",
            "",
        ]
        lines += [f"- {f}" for f in failed] + [""]
    lines += [
        f"{env['date']}; device {env.get('gpu', env['device'])}; platform `{env['platform']}`; "
        f"torch {env['torch']}; triton {env['triton']}; opcore {env['opcore']}",
        "",
        f"Decoder: {shape.layers} layers, hidden {shape.hidden}, "
        f"heads {shape.heads}/{shape.kv_heads} x {shape.head_size}, MLP {shape.intermediate}; "
        f"{str(dtype).removeprefix('torch.')}; CUDA graphs {'on' if cudagraphs else 'off'}. "
        "Median ms per forward; speedup vs torch.compile.",
        "",
        "| shape | tokens | torch.compile ms | opcore ms | opcore+fusion ms | opcore speedup "
        "| +fusion speedup |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['tokens']} | {r['torch.compile ms']:.4f} | {r['opcore ms']:.4f} | "
            f"{r['opcore+fusion ms']:.4f} | {r['opcore speedup']:.3f}x | "
            f"{r['opcore+fusion speedup']:.3f}x |"
        )
    lines += [
        "",
        "Max abs diff of each variant vs the uncompiled native decoder (eager native), third call; "
        f"tolerance {REL_TOLERANCE[dtype]:g} x max(1, max|eager|). CUDA graphs skipped: Inductor's "
        "`cudagraph_skips` counter moved while the variant compiled and ran.",
        "",
        "| shape | tokens | max abs eager | tolerance | torch.compile | opcore | opcore+fusion "
        "| CUDA graphs skipped |",
        "|---|---:|---:|---:|---|---|---|---|",
    ]
    for r in rows:
        skipped = [v for v in VARIANTS if r.get(f"{v} cudagraphs_skipped")]
        lines.append(
            f"| {r['kind']} | {r['tokens']} | {r['eager max_abs']:.3g} | {r['tolerance']:.3g} | "
            + " | ".join(_check(r, v) for v in VARIANTS)
            + f" | {', '.join(skipped) if skipped else 'none'} |"
        )
    if rows:
        lines += [
            "",
            "Lowering (opcore+fusion, first shape): "
            + ", ".join(
                f"{op} -> {'/'.join(p)}"
                for op, p in rows[0].get("opcore+fusion lowered", {}).items()
            ),
            "Fusions: " + json.dumps(rows[0].get("opcore+fusion fusions", {})),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for compile_decoder.json/.md")
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--decode", type=_ints, default=None, help="decode batch sizes (tokens)")
    parser.add_argument("--prefill", type=_ints, default=None, help="prefill lengths (tokens)")
    parser.add_argument("--context", type=int, default=None, help="KV context per decode token")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--no-cudagraphs", dest="cudagraphs", action="store_false")
    parser.add_argument(
        "--priority",
        default=None,
        help="provider priority for every op, e.g. triton,native (default: the platform's); "
        "on the CPU with TRITON_INTERPRET=1 this runs the Triton provider",
    )
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        help="default: bfloat16 on cuda, float32 on the CPU",
    )
    args = parser.parse_args(argv)
    args.config = None
    if args.priority:
        from opcore.ir import all_ops, ensure_kernels_loaded
        from opcore.settings import create_config

        ensure_kernels_loaded()
        names = [p.strip() for p in args.priority.split(",") if p.strip()]
        if "triton" in names:
            import opcore.kernels.triton  # noqa: F401  (registered by the GPU platforms; here on demand)
        args.config = create_config(ir_op_priority={op: names for op in all_ops()})

    from opcore.compile.decoder import DecoderShape

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.cudagraphs = args.cudagraphs and device.type == "cuda"
    dtype = (
        getattr(torch, args.dtype)
        if args.dtype
        else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    )
    if args.small:
        shape = DecoderShape(layers=2)
        args.decode = args.decode or [1, 4]
        args.prefill = args.prefill or [32]
        args.context = args.context or 16
        args.iters = args.iters or 5
    else:
        shape = DecoderShape.llama_8b_like(args.layers)
        args.decode = args.decode or [1, 8, 32, 128]
        args.prefill = args.prefill or [512, 2048]
        args.context = args.context or 1024
        args.iters = args.iters or 20
    env = environment(device)
    rows = []
    for kind, sizes in (("decode", args.decode), ("prefill", args.prefill)):
        for tokens in sizes:
            row = run_case(kind, tokens, args, shape, device, dtype)
            rows.append(row)
            print(
                json.dumps(
                    {k: v for k, v in row.items() if not k.endswith(("lowered", "fusions"))}
                ),
                flush=True,
            )
    os.makedirs(args.out, exist_ok=True)
    result = {
        "environment": env,
        "shape": shape.__dict__,
        "dtype": str(dtype),
        "cudagraphs": args.cudagraphs,
        "priority": args.priority,
        "failures": failures(rows),
        "rows": rows,
    }
    write_json(result, os.path.join(args.out, "compile_decoder.json"))
    md = markdown(env, rows, shape, dtype, args.cudagraphs)
    with open(os.path.join(args.out, "compile_decoder.md"), "w") as f:
        f.write(md)
    print(md)
    failed = failures(rows)
    for line in failed:
        print(f"FAIL: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
