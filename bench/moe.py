"""Mixture of experts on one device (issue 30): ``fused_experts``'s ``triton`` provider
against the native op, FlagGems' and Liger's fused MoE, and a dense GEMM.

**Prefill** rows (bf16; 4096 and 16384 tokens) on two model shapes: Qwen3-30B-A3B (hidden
2048, 128 experts, top-8, intermediate 768) and Mixtral-8x7B (hidden 4096, 8 experts,
top-2, intermediate 14336). Routing comes from random logits through ``topk_softmax``
(roughly uniform over the experts). Per provider: median and quartiles of the time, TFLOP/s
at the nominal ``2 * T * k * (2I * H + I * H)`` FLOPs, and that as a percentage of a dense
bf16 GEMM ``[T * k, H] @ [H, 3I]`` (the same FLOP count) measured in the same run; the
largest error against the native op.

- ``triton``: ``opcore.ir.ops.fused_experts`` with priority ``["triton", "native"]`` (the per-call
  path included);
- ``native``: the op's native function (a loop over the routed experts, fp32 matmuls);
- ``flag_gems``: ``flag_gems.fused.outplace_fused_experts`` (same weight layout), where
  importable;
- ``liger``: ``liger_kernel.ops.fused_moe.LigerFusedMoEFunction.apply(x, w13, w2, ids,
  weights)`` (same layout), where importable.

**Decode** rows (1, 4, 16, 64 tokens, both shapes): the time, and the weight bytes read
(experts touched x ``3 * I * H * 2``) over it as GB/s against the device's copy bandwidth
(`opcore.bench.timing.copy_bandwidth_gbs`); at 1 token also the latency per call replayed
from a graph (`opcore.bench.timing.graph_samples_us`), where a provider can be captured.

Device times come from `opcore.bench.timing.device_samples_us` (L2 flushed before each
call), host wall time on the CPU. Rows run in order (decode, then prefill) until
``--budget-s`` is spent (the rest are listed as not measured); ``moe.json`` and ``moe.md``
are written again after every row, so a run stopped by a time limit keeps the rows it
finished.

``--quick``: tiny shapes on the CPU under Triton's interpreter (set here when there is no
GPU), to check the script runs; its timings mean nothing.

Usage: python bench/moe.py [--quick] [--out DIR] [--rep-ms 40] [--budget-s 150]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

from opcore.bench.report import write_json

MODELS = {
    "qwen3-30b-a3b": dict(hidden=2048, experts=128, topk=8, inter=768),
    "mixtral-8x7b": dict(hidden=4096, experts=8, topk=2, inter=14336),
}
QUICK_MODELS = {"tiny": dict(hidden=64, experts=8, topk=2, inter=48)}
PROVIDERS = ("triton", "native", "flag_gems", "liger")


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def moe_flops(tokens: int, topk: int, hidden: int, inter: int) -> float:
    """``2 * T * k * (2I * H + I * H)``: both projections of every (token, slot) pair."""
    return 2.0 * tokens * topk * (2 * inter * hidden + inter * hidden)


def rows(quick: bool, phase: str = "all") -> list[dict]:
    """The bench's rows; ``phase`` ("decode", "prefill" or "all") keeps only those rows."""
    if phase != "all":
        return [r for r in rows(quick) if r["phase"] == phase]
    if quick:
        return [
            dict(model="tiny", phase="prefill", tokens=33),
            dict(model="tiny", phase="decode", tokens=1),
            dict(model="tiny", phase="decode", tokens=4),
        ]
    # Decode first: its rows take seconds where a prefill row takes tens, so a run cut by
    # its budget still has every decode row.
    out = [dict(model=m, phase="decode", tokens=t) for m in MODELS for t in (1, 4, 16, 64)]
    out += [dict(model=m, phase="prefill", tokens=t) for m in MODELS for t in (4096, 16384)]
    return out


def providers(dtype):
    """``{name: fn(x, w13, w2, weights, ids) or why-not string}``."""
    import torch

    from opcore.ir import ops

    def triton_fn(x, w13, w2, w, ids):
        return ops.fused_experts(x, w13, w2, w, ids)

    found = {"triton": triton_fn, "native": ops.fused_experts.native}
    try:
        from flag_gems.fused import outplace_fused_experts

        found["flag_gems"] = lambda x, w13, w2, w, ids: outplace_fused_experts(x, w13, w2, w, ids)
    except Exception as e:  # absent or broken install: say so in the report
        found["flag_gems"] = f"not importable: {type(e).__name__}: {str(e)[:120]}"
    try:
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

        def liger(x, w13, w2, w, ids):
            with torch.no_grad():
                return LigerFusedMoEFunction.apply(x, w13, w2, ids, w.to(x.dtype))

        found["liger"] = liger
    except Exception as e:
        found["liger"] = f"not importable: {type(e).__name__}: {str(e)[:120]}"
    return found


def make_case(cfg: dict, tokens: int, dtype, device, seed: int = 0):
    import torch

    from opcore.ir import ops

    g = torch.Generator(device="cpu").manual_seed(seed)
    h, e, k, i = cfg["hidden"], cfg["experts"], cfg["topk"], cfg["inter"]
    x = torch.randn(tokens, h, generator=g).to(device=device, dtype=dtype)
    w13 = (torch.randn(e, 2 * i, h, generator=g) * h**-0.5).to(device=device, dtype=dtype)
    w2 = (torch.randn(e, h, i, generator=g) * i**-0.5).to(device=device, dtype=dtype)
    logits = torch.randn(tokens, e, generator=g).to(device)
    w, ids = ops.topk_softmax.native(logits, k, True)
    return x, w13, w2, w, ids


def _timer(platform, device: str, rep_ms: int):
    import torch

    from opcore.bench import timing

    if device == "cuda":
        return lambda fn: timing.device_samples_us(fn, platform, rep_ms=rep_ms)
    sync = torch.cuda.synchronize if device == "cuda" else None
    return lambda fn: timing.host_samples_us(fn, synchronize=sync, warmup=1, reps=3)


def _stats(samples_us) -> dict:
    from opcore.bench import timing

    s = timing.spread(samples_us)
    return {"us": s.median_us, "us_q25": s.p25_us, "us_q75": s.p75_us, "reps": s.reps}


def run_row(row: dict, cfg: dict, found: dict, time_fn, platform, device: str, dtype, rep_ms):
    import torch

    from opcore.bench import timing
    from opcore.ir import ops

    t, k, h, i = row["tokens"], cfg["topk"], cfg["hidden"], cfg["inter"]
    x, w13, w2, w, ids = make_case(cfg, t, dtype, device)
    ref = ops.fused_experts.native(x, w13, w2, w, ids).float()
    out = {**row, **cfg, "dtype": str(dtype).replace("torch.", ""), "providers": {}}
    flops = moe_flops(t, k, h, i)
    touched = int(ids.unique().numel())
    weight_bytes = touched * 3 * i * h * x.element_size()
    out["experts_touched"] = touched
    if row["phase"] == "prefill":
        a = torch.randn(t * k, h, device=device, dtype=dtype)
        b = torch.randn(h, 3 * i, device=device, dtype=dtype)
        dense = _stats(time_fn(lambda: a @ b))
        dense["tflops"] = flops / (dense["us"] * 1e-6) / 1e12
        out["dense_gemm"] = dense
    for name in PROVIDERS:
        fn = found[name]
        if isinstance(fn, str):
            out["providers"][name] = {"skipped": fn}
            continue
        try:
            with (
                ops.fused_experts.set_priority(["triton", "native"])
                if name == "triton"
                else _null()
            ):
                got = fn(x, w13, w2, w, ids)
                rec = _stats(time_fn(lambda fn=fn: fn(x, w13, w2, w, ids)))
                rec["max_abs_err"] = float((got.float() - ref).abs().max())
                rec["ref_max_abs"] = float(ref.abs().max())
                if name == "triton":
                    rec["provider"] = ops.fused_experts.dispatch(x, w13, w2, w, ids).provider
                if row["phase"] == "prefill":
                    rec["tflops"] = flops / (rec["us"] * 1e-6) / 1e12
                    rec["tflops_q25"] = flops / (rec["us_q75"] * 1e-6) / 1e12
                    rec["tflops_q75"] = flops / (rec["us_q25"] * 1e-6) / 1e12
                    rec["pct_of_dense"] = 100.0 * rec["tflops"] / out["dense_gemm"]["tflops"]
                else:
                    rec["weight_gbs"] = weight_bytes / (rec["us"] * 1e-6) / 1e9
                    if t == 1 and device == "cuda" and name != "native":
                        try:
                            g = timing.graph_samples_us(
                                lambda fn=fn: fn(x, w13, w2, w, ids), platform, rep_ms=rep_ms
                            )
                            rec["graph"] = _stats(g) if g else None
                        except Exception as e:  # a provider that cannot be captured
                            rec["graph"] = f"not capturable: {type(e).__name__}: {str(e)[:160]}"
                            torch.cuda.synchronize()
            out["providers"][name] = rec
        except Exception as e:
            out["providers"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


# ``--sweep``: the grouped GEMMs' launch settings on the issue's shapes. Per problem (model,
# tokens) a BLOCK_M and a list of (BLOCK_N, BLOCK_K, warps, stages) per kernel: the gate/up
# kernel's are timed with today's down settings, then the down kernel's with the best
# gate/up ones (coordinate descent: the two kernels run one after the other and do not
# share tiles, only BLOCK_M).
SWEEP_PREFILL = {
    "gate_up": (
        (64, 64, 4, 3),
        (64, 64, 8, 3),
        (128, 64, 8, 3),
        (64, 64, 4, 4),
        (128, 64, 4, 3),
        (128, 32, 8, 4),
        (64, 128, 8, 3),
    ),
    "down": (
        (128, 64, 4, 3),
        (128, 64, 8, 3),
        (256, 64, 8, 3),
        (128, 128, 8, 3),
        (64, 64, 4, 3),
        (128, 64, 8, 4),
        (256, 32, 8, 4),
    ),
}
SWEEP_DECODE = {
    "gate_up": (
        (64, 128, 4, 3),
        (64, 128, 4, 4),
        (32, 128, 4, 4),
        (128, 128, 4, 3),
        (64, 256, 4, 3),
        (64, 64, 4, 5),
        (32, 256, 4, 3),
    ),
    "down": (
        (128, 128, 4, 3),
        (64, 128, 4, 4),
        (128, 128, 4, 4),
        (256, 128, 8, 3),
        (64, 256, 4, 3),
        (32, 128, 4, 4),
        (128, 64, 4, 5),
    ),
}
SWEEP_PROBLEMS = (
    ("qwen3-30b-a3b", 4096, (64, 128)),
    ("mixtral-8x7b", 4096, (128,)),
    ("qwen3-30b-a3b", 16, (16,)),
    ("qwen3-30b-a3b", 64, (16,)),
    ("mixtral-8x7b", 16, (16,)),
    ("mixtral-8x7b", 64, (16, 32)),
)


_KEYS = ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages")


def _time_setting(K, case, ref, base, bm, gate_up, down, time_fn) -> dict:
    """One sweep record: the triton kernels on ``case`` with `moe_params` replaced by one
    setting for the call (restored after it)."""
    setting = {
        "BLOCK_M": bm,
        "gate_up": dict(zip(_KEYS, gate_up, strict=True)),
        "down": dict(zip(_KEYS, down, strict=True)),
    }
    today = K.moe_params
    K.moe_params = lambda *a: setting
    rec = dict(base, BLOCK_M=bm, gate_up=list(gate_up), down=list(down))
    try:
        got = K.fused_experts(*case)
        rec["max_abs_err_vs_today"] = float((got.float() - ref).abs().max())
        rec.update(_stats(time_fn(lambda: K.fused_experts(*case))))
    except Exception as e:  # out of resources, for one
        rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        K.moe_params = today
    print(
        f"{base['model']}/{base['tokens']} M{bm} gate_up {gate_up} down {down}: "
        f"{rec.get('us', rec.get('error'))}",
        flush=True,
    )
    return rec


def sweep(time_fn, device, dtype, budget_s: float, quick: bool) -> list[dict]:
    """Time the triton provider's kernels (called directly, not through dispatch, so no
    bound replay keeps an earlier setting) under the `SWEEP_*` settings; one record per
    (problem, BLOCK_M, setting), with today's `moe_params` choice and the peers' times."""
    from opcore.kernels.triton import moe as K

    problems = (("tiny", 33, (16,)),) if quick else SWEEP_PROBLEMS
    models = QUICK_MODELS if quick else MODELS
    found = providers(dtype)
    out, start = [], time.perf_counter()
    for model, tokens, block_ms in problems:
        if time.perf_counter() - start > budget_s:
            out.append(dict(model=model, tokens=tokens, error="budget"))
            continue
        cfg = models[model]
        case = make_case(cfg, tokens, dtype, device)
        ref = K.fused_experts(*case).float()
        base = dict(model=model, tokens=tokens,
                    today=K.moe_params(tokens * cfg["topk"], cfg["experts"], False))  # fmt: skip
        for name in ("flag_gems", "liger"):
            fn = found[name]
            if not isinstance(fn, str) and device == "cuda":
                base[name + "_us"] = _stats(time_fn(lambda fn=fn, c=case: fn(*c)))["us"]
        space = SWEEP_DECODE if tokens <= 64 else SWEEP_PREFILL
        if quick:
            space = {k: v[:2] for k, v in space.items()}
        for bm in block_ms:
            recs = [
                _time_setting(K, case, ref, base, bm, g, space["down"][0], time_fn)
                for g in space["gate_up"]
            ]
            out += recs
            best = min(recs, key=lambda r: r.get("us", float("inf")))["gate_up"]
            out += [
                _time_setting(K, case, ref, base, bm, tuple(best), d, time_fn)
                for d in space["down"][1:]
            ]
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def markdown(result: dict) -> str:
    lines = [f"# fused_experts ({result['device']}, {result['date']})", ""]
    bw = result.get("copy_bandwidth_gbs")
    lines.append(f"Copy bandwidth: {_fmt(bw, '.0f')} GB/s. Times are medians [q25, q75] in us.")
    lines.append("")
    lines.append("## Prefill (TFLOP/s at 2*T*k*3*I*H; % of a dense bf16 GEMM of the same FLOPs)")
    lines.append("")
    lines.append("| model | tokens | dense TFLOP/s | " + " | ".join(PROVIDERS) + " |")
    lines.append("|---|---|---|" + "---|" * len(PROVIDERS))
    for r in result["rows"]:
        if r["phase"] != "prefill":
            continue
        cells = []
        for name in PROVIDERS:
            p = r["providers"][name]
            if "tflops" in p:
                cells.append(
                    f"{p['tflops']:.1f} [{p['tflops_q25']:.1f}, {p['tflops_q75']:.1f}] "
                    f"({p['pct_of_dense']:.0f} %), {p['us']:.0f} us, err {p['max_abs_err']:.1e}"
                )
            else:
                cells.append(p.get("skipped") or p.get("error", "-"))
        lines.append(
            f"| {r['model']} | {r['tokens']} | {r['dense_gemm']['tflops']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    lines += ["", "## Decode (weight bytes read / time, GB/s; graph replay at 1 token)", ""]
    lines.append("| model | tokens | experts touched | " + " | ".join(PROVIDERS) + " |")
    lines.append("|---|---|---|" + "---|" * len(PROVIDERS))
    for r in result["rows"]:
        if r["phase"] != "decode":
            continue
        cells = []
        for name in PROVIDERS:
            p = r["providers"][name]
            if "us" in p:
                c = f"{p['us']:.1f} us [{p['us_q25']:.1f}, {p['us_q75']:.1f}], "
                c += f"{p['weight_gbs']:.0f} GB/s"
                if bw:
                    c += f" ({100 * p['weight_gbs'] / bw:.0f} % of copy)"
                g = p.get("graph")
                if isinstance(g, dict):
                    c += f"; graph {g['us']:.1f} us [{g['us_q25']:.1f}, {g['us_q75']:.1f}]"
                elif isinstance(g, str):
                    c += f"; graph: {g[:60]}"
                c += f", err {p['max_abs_err']:.1e}"
                cells.append(c)
            else:
                cells.append(p.get("skipped") or p.get("error", "-"))
        lines.append(
            f"| {r['model']} | {r['tokens']} | {r['experts_touched']} | " + " | ".join(cells) + " |"
        )
    if result["not_measured"]:
        lines += ["", "Not measured (budget): " + ", ".join(result["not_measured"])]
    return "\n".join(lines) + "\n"


def _write(out: str | None, result: dict) -> str:
    """Write ``moe.json`` and ``moe.md`` under ``out`` (when given); the Markdown."""
    md = markdown(result)
    if out:
        os.makedirs(out, exist_ok=True)
        write_json(result, os.path.join(out, "moe.json"))
        with open(os.path.join(out, "moe.md"), "w") as f:
            f.write(md)
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rep-ms", type=int, default=40)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--sweep", action="store_true", help="only the grouped GEMMs' settings")
    ap.add_argument("--phase", choices=("all", "decode", "prefill"), default="all")
    args = ap.parse_args(argv)
    if args.quick and "TRITON_INTERPRET" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    import torch

    import opcore.kernels.triton  # noqa: F401  (registers provider "triton")
    from opcore.bench import timing
    from opcore.platforms import get_current_platform

    device = _device()
    platform = get_current_platform()
    dtype = torch.bfloat16
    models = QUICK_MODELS if args.quick else MODELS
    found = providers(dtype)
    if args.quick:  # the interpreter runs the triton provider; others need a GPU
        for name in ("flag_gems", "liger"):
            if not isinstance(found[name], str) and device == "cpu":
                found[name] = "needs a GPU"
    time_fn = _timer(platform, device, args.rep_ms)
    if args.sweep:
        recs = sweep(time_fn, device, dtype, args.budget_s, args.quick)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
            write_json({"device": name, "records": recs}, os.path.join(args.out, "moe_sweep.json"))
        return 0 if any("us" in r for r in recs) else 1
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)",
        "copy_bandwidth_gbs": timing.copy_bandwidth_gbs(platform) if device == "cuda" else None,
        "rows": [],
        "not_measured": [],
    }
    start = time.perf_counter()
    for row in rows(args.quick, args.phase):
        label = f"{row['model']}/{row['phase']}/{row['tokens']}"
        if time.perf_counter() - start > args.budget_s:
            result["not_measured"].append(label)
            continue
        t0 = time.perf_counter()
        rec = run_row(
            row, models[row["model"]], found, time_fn, platform, device, dtype, args.rep_ms
        )
        result["rows"].append(rec)
        brief = {
            n: p.get("us", p.get("error", p.get("skipped"))) for n, p in rec["providers"].items()
        }
        print(f"{label}: {brief} ({time.perf_counter() - t0:.1f} s)", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
        _write(args.out, result)
    md = _write(args.out, result)
    print(md)
    bad = [
        f"{r['model']}/{r['tokens']}"
        for r in result["rows"]
        if "us" not in r["providers"]["triton"]
        or r["providers"]["triton"].get("provider") != "triton"
    ]
    if bad:
        print("triton provider failed or not chosen on:", ", ".join(bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
