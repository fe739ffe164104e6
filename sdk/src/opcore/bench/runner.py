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
    device: str | None = None  # None: the current platform's device
    quick: bool = False
    rep_ms: int = 60
    jsonl: str | None = None  # append each record as it is measured
    copy_bytes: int = 1 << 31  # the copy whose rate GB/s are compared with


def bench_device(platform: Any, device: str | torch.device | None) -> torch.device:
    """``device`` (default: ``platform``'s), checked: a device of the platform's type, or
    the host CPU (timed with the host clock).

    Raises:
        ValueError: ``device`` is another platform's device (its timers and
            synchronisation would be the wrong ones).
    """
    dev = platform.device() if device is None else torch.device(device)
    if dev.type not in (platform.device_type, "cpu"):
        raise ValueError(
            f"device {str(dev)!r} is not a device of the current platform {platform.name!r} "
            f"({platform.device_type}) nor the host cpu; select its platform with OPCORE_PLATFORM"
        )
    return dev


def environment(device: torch.device, platform: Any | None = None) -> dict[str, Any]:
    """Date, versions, the platform, and its `Platform.device_summary` for the device
    (name, capability, and whatever the platform adds, a driver version say)."""
    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "torch": torch.__version__,
        "platform": platform.name,
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
    if device.type != platform.device_type:
        return env  # the host cpu under another platform: nothing of the platform's to add
    try:
        summary = platform.device_summary()
    except Exception as exc:  # a failing query must not lose the benchmark
        env["device"] = f"unknown ({type(exc).__name__}: {exc})"
        return env
    index = device.index or 0
    for entry in summary.get("devices", []):
        if entry.get("index") == index:
            env["device"] = entry.get("name")
            if entry.get("capability") is not None:
                env["capability"] = list(entry["capability"])
    env.update({k: v for k, v in summary.items() if k not in ("count", "devices")})
    return env


def _time(fn, platform: Any, timers: str, rep_ms: int) -> dict[str, float]:
    if timers == "host":
        sync = platform.synchronize if platform.device_type != "cpu" else None
        return {"cpu_us": timing.host_median_us(fn, synchronize=sync)}
    out = {"device_us": timing.device_median_us(fn, platform, rep_ms=rep_ms)}
    graph = timing.graph_median_us(fn, platform, rep_ms=rep_ms, estimate_us=out["device_us"])
    if graph is not None:
        out["graph_us"] = graph
    return out


def run(opts: Options, log=print, platform: Any | None = None) -> dict[str, Any]:
    """Time every op x provider x shape of ``opts`` on ``platform`` (default: the current
    one): ``{"environment": ..., "records": [...]}``. A case that fails is a record with
    ``error``; the others go on."""
    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    device = bench_device(platform, opts.device)
    timers = timing.timers(platform, device)
    env = environment(device, platform)
    env["timers"] = timers
    copy_gbs = timing.copy_bandwidth_gbs(platform, opts.copy_bytes) if timers == "device" else None
    env["copy_gbs"] = copy_gbs
    log(
        f"opcore bench on {env.get('device', device.type)} ({timers} timers): copy bandwidth "
        f"{'n/a' if copy_gbs is None else f'{copy_gbs:.0f} GB/s'}"
    )
    on_platform = device.type == platform.device_type
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
                                if on_platform:
                                    platform.synchronize()
                                t = _time(fn, platform, timers, opts.rep_ms)
                            rec = _record(case, name, env, t)
                        except Exception as exc:
                            # one line: the Markdown table and the log show it whole
                            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
                            rec = _record(case, name, env, None, error=why)
                        records.append(rec)
                        if sink:
                            sink.write(json.dumps(rec) + "\n")
                            sink.flush()
                        log(_line(rec))
                    del case, fns
                if on_platform:
                    platform.empty_cache()
    finally:
        if sink:
            sink.close()
    _speedups(records)
    return {"environment": env, "records": records}


def _record(case, provider, env, t, *, skipped=None, error=None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "op": case.op,
        "layout": case.layout,
        "tokens": case.tokens,
        "hidden": case.hidden,
        "dtype": str(case.dtype).removeprefix("torch."),
        "provider": provider,
        "bytes": case.nbytes,
    }
    if skipped:
        rec["skipped"] = skipped
    if error:
        rec["error"] = error
    if t:
        rec.update(t)
        copy = env.get("copy_gbs")
        for key in ("device_us", "graph_us"):
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
                for key in ("device_us", "graph_us", "cpu_us"):
                    if b and key in b and key in r:
                        r[f"speedup_vs_{base}_{key.removesuffix('_us')}"] = b[key] / r[key]


def _line(r: dict[str, Any]) -> str:
    head = f"{r['op']:<24} {r['layout']:<14} T={r['tokens']:<6} {r['provider']:<16}"
    if "error" in r:
        return head + " ERROR " + r["error"]
    if "cpu_us" in r:
        return head + f" {r['cpu_us']:10.1f} us"
    graph = f"  graph {r['graph_us']:9.2f} us" if "graph_us" in r else ""
    return head + (
        f" device {r['device_us']:9.2f} us{graph}  {r.get('device_pct_copy', 0):5.1f}% copy"
    )
