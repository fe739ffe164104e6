"""The benchmark matrix: op x provider x shape, timed, with bytes and speedups."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

import torch

from opcore.bench import baselines, cases, timing


@dataclasses.dataclass
class Options:
    ops: tuple[str, ...] = cases.OPS
    tokens: tuple[int, ...] = cases.DECODE_TOKENS + cases.PREFILL_TOKENS
    hidden: tuple[int, ...] = cases.HIDDEN
    providers: set[str] | None = None
    dtype: torch.dtype = torch.bfloat16
    device: str = "cuda"
    quick: bool = False
    rep_ms: int = 60
    jsonl: str | None = None  # append each record as it is measured


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "torch": torch.__version__,
        "device_type": device.type,
        "python": sys.version.split()[0],
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        env["liger_kernel"] = version("liger-kernel")
    except Exception:
        env["liger_kernel"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["capability"] = list(torch.cuda.get_device_capability(device))
        env["cuda"] = torch.version.cuda
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception as exc:
            env["driver"] = f"unknown ({type(exc).__name__})"
    return env


def _time(fn, device: torch.device, rep_ms: int) -> dict[str, float]:
    if device.type == "cuda":
        return {
            "do_bench_us": timing.gpu_do_bench_us(fn, rep_ms=rep_ms),
            "graph_us": timing.gpu_graph_us(fn, rep_ms=rep_ms),
        }
    return {"cpu_us": timing.cpu_median_us(fn)}


def run(opts: Options, log=print) -> dict[str, Any]:
    device = torch.device(opts.device)
    env = environment(device)
    copy_gbs = timing.copy_bandwidth_gbs(device) if device.type == "cuda" else None
    env["copy_gbs"] = copy_gbs
    log(f"opcore bench on {env.get('gpu', device.type)}: copy bandwidth "
        f"{'n/a' if copy_gbs is None else f'{copy_gbs:.0f} GB/s'}")
    records: list[dict[str, Any]] = []
    sink = open(opts.jsonl, "a", encoding="utf-8") if opts.jsonl else None  # noqa: SIM115
    try:
        # hidden outermost: a run cut short still has every op at the first hidden size
        for hidden in opts.hidden:
            for op in opts.ops:
                for tokens in opts.tokens:
                    case = cases.build(op, tokens, hidden, opts.dtype, device, quick=opts.quick)
                    fns, skipped = baselines.providers(case, opts.providers)
                    for name, why in skipped.items():
                        records.append(_record(case, name, env, None, skipped=why))
                    for name, fn in fns.items():
                        try:
                            with torch.inference_mode():
                                fn()  # compile / JIT outside the timed region
                                if device.type == "cuda":
                                    torch.cuda.synchronize()
                                t = _time(fn, device, opts.rep_ms)
                            rec = _record(case, name, env, t)
                        except Exception as exc:
                            rec = _record(case, name, env, None, error=f"{type(exc).__name__}: {exc}"[:300])
                        records.append(rec)
                        if sink:
                            sink.write(json.dumps(rec) + "\n")
                            sink.flush()
                        log(_line(rec))
                    del case, fns
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    finally:
        if sink:
            sink.close()
    _speedups(records)
    return {"environment": env, "records": records}


def _record(case, provider, env, t, *, skipped=None, error=None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "op": case.op, "layout": case.layout, "tokens": case.tokens, "hidden": case.hidden,
        "dtype": str(case.dtype).removeprefix("torch."), "provider": provider,
        "bytes": case.nbytes,
    }
    if skipped:
        rec["skipped"] = skipped
    if error:
        rec["error"] = error
    if t:
        rec.update(t)
        copy = env.get("copy_gbs")
        for key in ("do_bench_us", "graph_us"):
            if key in t:
                gbs = case.nbytes / (t[key] * 1e-6) / 1e9
                rec[key.replace("_us", "_gbs")] = gbs
                if copy:
                    rec[key.replace("_us", "_pct_copy")] = 100 * gbs / copy
    return rec


def _speedups(records: list[dict[str, Any]]) -> None:
    """Adds ``speedup_vs_<baseline>_<timer>`` (baseline time / this time) to each record."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        groups.setdefault((r["op"], r["layout"], r["tokens"]), {})[r["provider"]] = r
    for group in groups.values():
        for r in group.values():
            for base in ("native", "compile"):
                b = group.get(base)
                for key in ("do_bench_us", "graph_us", "cpu_us"):
                    if b and key in b and key in r:
                        r[f"speedup_vs_{base}_{key.removesuffix('_us')}"] = b[key] / r[key]


def _line(r: dict[str, Any]) -> str:
    head = f"{r['op']:<24} {r['layout']:<14} T={r['tokens']:<6} {r['provider']:<16}"
    if "error" in r:
        return head + " ERROR " + r["error"]
    if "cpu_us" in r:
        return head + f" {r['cpu_us']:10.1f} us"
    return head + (f" bench {r['do_bench_us']:9.2f} us  graph {r['graph_us']:9.2f} us"
                   f"  {r.get('do_bench_pct_copy', 0):5.1f}% copy")
