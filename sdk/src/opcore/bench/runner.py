"""The benchmark matrix: op x provider x shape, timed, with bytes and speedups."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

import torch

from opcore.bench import baselines, cases, metadata, timing


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
    rounds: int = 1  # each case's providers timed this many times, the order rotated
    jsonl: str | None = None  # append each record as it is measured
    copy_bytes: int = 1 << 31  # the copy whose rate GB/s are compared with
    threads: int | None = None  # torch threads; None: the default on the host CPU only


def bench_device(platform: Any, device: str | torch.device | None) -> torch.device:
    """``device`` (default: ``platform``'s), checked: a device of the platform's type, or
    the host CPU (timed with the host clock).

    Raises:
        ValueError: ``device`` is not a device name torch knows in this process (a typo, or
            the device type of a platform that is not loaded, such as ``vdev`` without
            ``OPCORE_VDEV=1``), is another platform's device (its timers and
            synchronisation would be the wrong ones), or has an index the platform does
            not have.
    """
    if device is None:
        return platform.device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"device {str(device)!r} is not a device torch knows in this process; the current "
            f"platform {platform.name!r} has device type {platform.device_type!r} (another "
            f"platform's device needs that platform selected: OPCORE_PLATFORM, or "
            f"OPCORE_VDEV=1 for vdev)"
        ) from None
    if dev.type not in (platform.device_type, "cpu"):
        raise ValueError(
            f"device {str(dev)!r} is not a device of the current platform {platform.name!r} "
            f"({platform.device_type}) nor the host cpu; select its platform with OPCORE_PLATFORM"
        )
    if dev.type != "cpu" and dev.index is not None:
        count = platform.device_count()
        if dev.index >= count:
            raise ValueError(
                f"device {str(dev)!r} does not exist: the current platform {platform.name!r} "
                f"has {count} device(s) here"
            )
    return dev


def environment(device: torch.device, platform: Any | None = None) -> dict[str, Any]:
    """Date, versions (opcore, torch, Triton, Liger, every plugin distribution), the host
    (CPU, cores, load average), the platform, and its `Platform.device_summary` for the
    device (name, capability, and whatever the platform adds, a driver version say)."""
    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "torch": torch.__version__,
        "platform": platform.name,
        "device_type": device.type,
        "python": sys.version.split()[0],
        "opcore": metadata.distribution_version("opcore"),
        "plugins": metadata.plugin_versions(),
        "host_cpu": metadata.host_cpu(),
        "logical_cpus": metadata.available_logical_cpus(),
        "physical_cores": metadata.physical_cores(),
        "load_average_start": metadata.load_average(),
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
    try:  # the distribution's version only: importing FlagGems is the peer's business
        from importlib.metadata import version

        env["flag_gems"] = version("flag_gems")
    except Exception:
        env["flag_gems"] = None
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


def check_selection(
    op_names: tuple[str, ...], providers: set[str] | None, platform_name: str = ""
) -> None:
    """Refuse names `run` would silently time nothing for (``platform_name``, when given,
    is named in the message: which providers are registered depends on the platform).

    Raises:
        UnknownNameError: an op that is not one of `cases.OPS`, or a provider that is
            neither registered for the selected ops nor a peer that applies to them
            (`baselines.known_names`); the message names it and lists the valid ones.
    """
    bad = [o for o in op_names if o not in cases.OPS]
    if bad:
        raise UnknownNameError("--ops", "op", bad, list(cases.OPS))
    if providers:
        valid = baselines.known_names(op_names)
        bad = sorted(p for p in providers if p not in valid)
        if bad:
            where = f" on platform {platform_name}" if platform_name else ""
            raise UnknownNameError("--providers", "provider", bad, valid, op_names, where)


class UnknownNameError(ValueError):
    """A name given to `opcore bench` that it does not know; ``flag`` is the option."""

    def __init__(
        self,
        flag: str,
        what: str,
        names: list[str],
        valid: list[str],
        op_names: tuple[str, ...] = (),
        where: str = "",
    ) -> None:
        self.flag, self.names, self.valid = flag, names, valid
        scope = (f" for op(s) {', '.join(op_names)}" if op_names else "") + where
        plural = "s" if len(names) > 1 else ""
        super().__init__(
            f"unknown {what}{plural} {', '.join(map(repr, names))}{scope} "
            f"(choose from {', '.join(map(repr, valid))})"
        )


def _samples(fn, platform: Any, timers: str, rep_ms: int) -> dict[str, list[float]]:
    """``{timer: samples_us}`` of each timer that ran for ``fn``."""
    return {
        t: list(s) for t, s in timing.bench_samples_us(fn, platform, timers, rep_ms=rep_ms).items()
    }


def _summary(rounds: list[dict[str, list[float]]]) -> dict[str, Any]:
    """``{"<timer>_us": median, "<timer>_spread": Spread.as_dict()}`` per timer, over the
    samples of every round pooled; with more than one round also ``"<timer>_round_us"``,
    each round's median in the order timed."""
    out: dict[str, Any] = {}
    for timer in rounds[0]:
        pooled = [x for r in rounds for x in r.get(timer, ())]
        sp = timing.spread(pooled)
        out[f"{timer}_us"] = sp.median_us
        out[f"{timer}_spread"] = sp.as_dict()
        if len(rounds) > 1:
            out[f"{timer}_round_us"] = [timing.spread(r[timer]).median_us for r in rounds]
    return out


def rotated(names: list[str], round_index: int) -> list[str]:
    """The order ``names`` are timed in round ``round_index`` (0-based): shifted left by
    the round, so that with as many rounds as names each is timed first once (a device's
    clocks and caches favour one position; rotating spreads that over the providers)."""
    k = round_index % len(names) if names else 0
    return names[k:] + names[:k]


def _threads(opts: Options, device: torch.device) -> tuple[int | None, str]:
    """The torch thread count to pin (None: leave it) and why, for the record."""
    if opts.threads is not None:
        return opts.threads, "pinned by --threads"
    if device.type == "cpu":
        return metadata.default_threads(), (
            f"pinned to the default: min(physical cores available, {metadata.DEFAULT_MAX_THREADS})"
        )
    return None, "not pinned: the ops run on the device, not the host's threads"


def run(opts: Options, log=print, platform: Any | None = None) -> dict[str, Any]:
    """Time every op x provider x shape of ``opts`` on ``platform`` (default: the current
    one): ``{"environment": ..., "records": [...], "warnings": [...]}``. A case that fails
    is a record with ``error``; the others go on. On the host CPU (or with
    ``opts.threads``) torch's thread count is pinned for the run and restored after it.

    Raises:
        UnknownNameError: see `check_selection`.
    """
    if platform is None:
        platform = _current()
    check_selection(opts.ops, opts.providers, platform.name)
    threads, why = _threads(opts, bench_device(platform, opts.device))
    if threads is None:
        result = _run(opts, log, platform, why)
    else:
        with metadata.pinned_threads(threads):
            result = _run(opts, log, platform, why)
    result["environment"]["torch_threads_after"] = torch.get_num_threads()
    return result


def _current() -> Any:
    from opcore.platforms import get_current_platform

    return get_current_platform()


def _run(opts: Options, log, platform: Any, threads_why: str) -> dict[str, Any]:
    device = bench_device(platform, opts.device)
    timers = timing.timers(platform, device)
    env = environment(device, platform)
    env["timers"] = timers
    env["torch_threads"] = torch.get_num_threads()
    env["threads_pinned"] = threads_why
    env["provider_identity"] = metadata.provider_identities(opts.ops)
    env["rounds"] = opts.rounds
    env["spread_warn"] = timing.SPREAD_WARN
    env["spread_unusable"] = timing.SPREAD_UNUSABLE
    if timers == "device":
        copy_gbs = timing.copy_bandwidth_gbs(platform, opts.copy_bytes)
        env["copy_timer"] = "device"
    else:
        sync = platform.synchronize if device.type == platform.device_type != "cpu" else None
        copy_gbs = timing.host_copy_bandwidth_gbs(
            device, synchronize=sync, nbytes=min(opts.copy_bytes, timing.HOST_COPY_BYTES)
        )
        env["copy_timer"] = "host"
    env["copy_gbs"] = copy_gbs
    log(
        f"opcore bench on {env.get('device', device.type)} ({timers} timers): copy bandwidth "
        f"{'n/a' if copy_gbs is None else f'{copy_gbs:.0f} GB/s'}; torch threads "
        f"{env['torch_threads']} ({threads_why}); load average {env['load_average_start']}"
    )
    on_platform = device.type == platform.device_type
    records: list[dict[str, Any]] = []
    sink = open(opts.jsonl, "a", encoding="utf-8") if opts.jsonl else None  # noqa: SIM115
    try:
        if sink:  # a JSON Lines file describes its own run: the environment comes first
            sink.write(json.dumps({"type": "header", "environment": env}) + "\n")
            sink.flush()
        # hidden outermost: a run cut short still has every op at the first hidden size
        for hidden in opts.hidden:
            for op in opts.ops:
                for tokens in opts.tokens:
                    case = cases.build(op, tokens, hidden, opts.dtype, device, quick=opts.quick)
                    fns, skipped = baselines.providers(case, opts.providers)
                    for name, why in skipped.items():
                        rec = _record(case, name, env, None, skipped=why)
                        records.append(rec)
                        if sink:  # a run cut short still says why a peer is missing
                            sink.write(json.dumps(rec) + "\n")
                            sink.flush()
                    for rec in time_case(case, fns, env, platform, timers, opts, on_platform):
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
    env["load_average_end"] = metadata.load_average()
    _speedups(records)
    warnings = load_warnings(env) + spread_warnings(records)
    return {"environment": env, "records": records, "warnings": warnings}


def time_case(case, fns, env, platform, timers, opts: Options, on_platform: bool):
    """The records of one case's providers, in ``fns``'s order: each timed
    ``opts.rounds`` times in `rotated` order, its samples pooled. A provider that raises
    is a record with ``error`` and is not timed again; the others go on."""
    samples: dict[str, list[dict[str, list[float]]]] = {name: [] for name in fns}
    errors: dict[str, str] = {}
    for r in range(opts.rounds):
        for name in rotated([n for n in fns if n not in errors], r):
            fn = fns[name]
            try:
                with torch.inference_mode():
                    if r == 0:
                        fn()  # compile / JIT outside the timed region
                        if on_platform:
                            platform.synchronize()
                    samples[name].append(_samples(fn, platform, timers, opts.rep_ms))
            except Exception as exc:
                # one line: the Markdown table and the log show it whole
                errors[name] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    out = []
    for name in fns:
        if name in errors:
            out.append(_record(case, name, env, None, error=errors[name]))
        else:
            rec = _record(case, name, env, _summary(samples[name]))
            if opts.rounds > 1:
                rec["rounds"] = opts.rounds
            out.append(rec)
    return out


def load_warnings(env: dict[str, Any]) -> list[str]:
    """A line when the 1-minute load average, at the start or the end of the run, was over
    the logical CPUs this process may use: other work shared the host's cores, so host
    timings (and launch costs) are suspect even where their spread is small."""
    cpus = env.get("logical_cpus") or 0
    loads = [x[0] for x in (env.get("load_average_start"), env.get("load_average_end")) if x]
    if cpus and loads and max(loads) > cpus:
        return [
            f"host busy: 1-minute load average {max(loads):.2f} over the {cpus} logical CPUs "
            f"available; other processes shared the cores during the run"
        ]
    return []


def _record(case, provider, env, t, *, skipped=None, error=None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "op": case.op,
        "layout": case.layout,
        "tokens": case.tokens,
        "hidden": case.hidden,
        "dtype": str(case.dtype).removeprefix("torch."),
        "provider": provider,
        "bytes": case.nbytes,
        "identity": env["provider_identity"].get(case.op, {}).get(provider),  # None: a peer
        "torch_threads": torch.get_num_threads(),
        "load_1m": _load_1m(),
    }
    if skipped:
        rec["skipped"] = skipped
    if error:
        rec["error"] = error
    if t:
        rec.update(t)
        copy = env.get("copy_gbs")
        for key in ("device_us", "graph_us", "cpu_us"):
            if key in t:
                gbs = case.nbytes / (t[key] * 1e-6) / 1e9
                rec[key.replace("_us", "_gbs")] = gbs
                if copy:
                    rec[key.replace("_us", "_pct_copy")] = 100 * gbs / copy
    return rec


def _load_1m() -> float | None:
    load = metadata.load_average()
    return load[0] if load else None


def _speedups(records: list[dict[str, Any]]) -> None:
    """Adds, per baseline (native, compile) and timer, ``speedup_vs_<base>_<timer>``: the
    baseline's median over this one's; ``..._range``: ``[base p25 / this p75, base p75 /
    this p25]``, the ratio's spread from the two IQRs. Where either side's IQR/median is
    over `timing.SPREAD_UNUSABLE` the ratio is ``None`` and ``..._unusable`` says why."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        groups.setdefault((r["op"], r["layout"], r["tokens"]), {})[r["provider"]] = r
    for group in groups.values():
        for r in group.values():
            for base in ("native", "compile"):
                b = group.get(base)
                for timer in ("device", "graph", "cpu"):
                    sb, sr = (x.get(f"{timer}_spread") if x else None for x in (b, r))
                    if not (sb and sr):
                        continue
                    key = f"speedup_vs_{base}_{timer}"
                    sides = {base: sb, r["provider"]: sr}  # one entry when r is the base
                    noisy = [
                        f"{who} IQR/median {s['iqr_over_median']:.0%}"
                        for who, s in sides.items()
                        if s["iqr_over_median"] > timing.SPREAD_UNUSABLE
                    ]
                    if noisy:
                        r[key] = None
                        r[f"{key}_unusable"] = (
                            f"{', '.join(noisy)} over {timing.SPREAD_UNUSABLE:.0%}"
                        )
                        continue
                    r[key] = sb["median_us"] / sr["median_us"]
                    r[f"{key}_range"] = [sb["p25_us"] / sr["p75_us"], sb["p75_us"] / sr["p25_us"]]


def spread_warnings(records: list[dict[str, Any]]) -> list[str]:
    """One line per measurement whose IQR/median is over `timing.SPREAD_WARN`."""
    out = []
    for r in records:
        for timer in ("device", "graph", "cpu"):
            s = r.get(f"{timer}_spread")
            if s and s["iqr_over_median"] > timing.SPREAD_WARN:
                out.append(
                    f"large spread: {r['op']} {r['layout']} T={r['tokens']} {r['provider']} "
                    f"({timer}): "
                    f"IQR/median {s['iqr_over_median']:.1%} over {timing.SPREAD_WARN:.0%} "
                    f"(p25 {s['p25_us']:.2f}, median {s['median_us']:.2f}, "
                    f"p75 {s['p75_us']:.2f} µs, {s['reps']} reps)"
                )
    return out


def _line(r: dict[str, Any]) -> str:
    head = f"{r['op']:<24} {r['layout']:<14} T={r['tokens']:<6} {r['provider']:<16}"
    if "error" in r:
        return head + " ERROR " + r["error"]
    if "skipped" in r:
        return head + " skipped: " + r["skipped"]

    def iqr(timer: str) -> str:
        return f" (IQR {r[f'{timer}_spread']['iqr_over_median']:.0%})"

    if "cpu_us" in r:
        return head + f" {r['cpu_us']:10.1f} us{iqr('cpu')}"
    graph = f"  graph {r['graph_us']:9.2f} us{iqr('graph')}" if "graph_us" in r else ""
    return head + (
        f" device {r['device_us']:9.2f} us{iqr('device')}{graph}  "
        f"{r.get('device_pct_copy', 0):5.1f}% copy"
    )
