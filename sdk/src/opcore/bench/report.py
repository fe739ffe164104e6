"""Outputs of `opcore bench`: JSON (everything), a Markdown report (the run's environment,
a table of medians with their spread, provider identities, spread warnings) and PNG plots
(time against tokens, % of copy bandwidth against tokens) when matplotlib imports."""

from __future__ import annotations

import json
import os
from typing import Any

PLOTS = {"time": "bench.png", "pct_copy": "bench_pct_copy.png"}


def write_json(result: Any, path: str) -> None:
    """``result`` (a run's dict, or a bench script's list of rows) as indented JSON at
    ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


def _us(v: float) -> str:
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _timed(r: dict[str, Any], timer: str, warn: float) -> str:
    """``median (p25–p75)`` in µs, flagged when IQR/median is over ``warn``."""
    s = r.get(f"{timer}_spread")
    if not s:
        return ""
    flag = " ⚠" if s["iqr_over_median"] > warn else ""
    return f"{_us(s['median_us'])} ({_us(s['p25_us'])}–{_us(s['p75_us'])}){flag}"


def _speedup(r: dict[str, Any], key: str) -> str:
    if f"{key}_unusable" in r:
        return "n/a: " + r[f"{key}_unusable"]
    v = r.get(key)
    if v is None:
        return ""
    lo, hi = r[f"{key}_range"]
    return f"{v:.2f}× ({lo:.2f}–{hi:.2f})"


def _f(v, fmt="{:.2f}") -> str:
    return "" if v is None else fmt.format(v)


def header(result: dict[str, Any]) -> list[str]:
    """The run's environment as Markdown lines: what a reader needs to trust the table."""
    env = result["environment"]
    load = env.get("load_average_start")
    load_end = env.get("load_average_end")
    plugins = env.get("plugins") or {}
    dev = env.get("device") or env.get("device_type")
    cap = env.get("capability")
    copy = env.get("copy_gbs")
    extra = {
        k: v
        for k, v in env.items()
        if k
        not in {
            "date", "platform", "device", "device_type", "capability", "timers", "torch",
            "triton", "python", "opcore", "liger_kernel", "plugins", "host_cpu",
            "logical_cpus", "physical_cores", "load_average_start", "load_average_end",
            "torch_threads", "torch_threads_after", "threads_pinned", "provider_identity",
            "spread_warn", "spread_unusable", "copy_gbs", "copy_timer",
        }
    }  # fmt: skip
    lines = [
        f"- date: {env.get('date')}",
        f"- platform: {env.get('platform')}, device: {dev}"
        + (f" (capability {'.'.join(map(str, cap))})" if cap else "")
        + f", timers: {env.get('timers')}"
        + "".join(f", {k}: {v}" for k, v in extra.items()),
        f"- versions: opcore {env.get('opcore')}, torch {env.get('torch')}, "
        f"triton {env.get('triton')}, python {env.get('python')}, "
        f"liger_kernel {env.get('liger_kernel')}",
        "- plugins: " + (", ".join(f"{d} {v}" for d, v in plugins.items()) or "none installed"),
        f"- host: {env.get('host_cpu')}, {env.get('physical_cores')} physical cores, "
        f"{env.get('logical_cpus')} logical CPUs available",
        f"- torch threads: {env.get('torch_threads')} ({env.get('threads_pinned')})",
        f"- load average (1, 5, 15 min): {_load(load)} at the start, {_load(load_end)} at the end",
        "- copy bandwidth: "
        + (f"{copy:.0f} GB/s ({env.get('copy_timer')} timer)" if copy else "not measured"),
        f"- spread: each time is the median of its repetitions, with the interquartile range "
        f"(p25–p75); ⚠ marks IQR/median over {env.get('spread_warn', 0):.0%}; a speedup is "
        f"the ratio of medians with the range from both IQRs, not given where either IQR/"
        f"median is over {env.get('spread_unusable', 0):.0%}",
    ]
    identity = env.get("provider_identity") or {}
    if identity:
        lines.append("- provider identity (source hash, first 16 hex digits):")
        lines += [
            f"  - {op}: " + ", ".join(f"{p} `{h[:16]}`" for p, h in ids.items())
            for op, ids in identity.items()
        ]
    return lines


def _load(load) -> str:
    return " ".join(f"{x:.2f}" for x in load) if load else "unknown"


def markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    warn = env.get("spread_warn", float("inf"))
    lines = ["# opcore bench", "", *header(result), ""]
    recs = result["records"]
    gpu = any("device_us" in r for r in recs)  # the platform's timing events were used
    if gpu:
        head = (
            "| op | layout | tokens | provider | device µs (p25–p75) | graph µs (p25–p75) "
            "| reps | GB/s | % copy | × native (graph) | × compile (graph) "
            "| × compile (device) |"
        )
        lines += [head, "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    else:
        lines += [
            "| op | layout | tokens | provider | host µs (p25–p75) | min µs | reps | GB/s "
            "| % copy | × native | × compile |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for r in recs:
        row = f"| {r['op']} | {r['layout']} | {r['tokens']} | {r['provider']} |"
        if "skipped" in r or "error" in r:
            note = r.get("skipped") or ("error: " + r["error"])
            ncols = 8 if gpu else 7
            lines.append(row + f" {note} |" + " |" * (ncols - 1))
            continue
        if gpu:
            reps = "/".join(
                str(r[f"{t}_spread"]["reps"]) for t in ("device", "graph") if f"{t}_spread" in r
            )
            lines.append(
                row + f" {_timed(r, 'device', warn)} | {_timed(r, 'graph', warn)} | {reps} | "
                f"{_f(r.get('device_gbs'), '{:.0f}')} | {_f(r.get('device_pct_copy'), '{:.1f}')} | "
                f"{_speedup(r, 'speedup_vs_native_graph')} | "
                f"{_speedup(r, 'speedup_vs_compile_graph')} | "
                f"{_speedup(r, 'speedup_vs_compile_device')} |"
            )
        else:
            s = r["cpu_spread"]
            lines.append(
                row + f" {_timed(r, 'cpu', warn)} | {_us(s['min_us'])} | {s['reps']} | "
                f"{_f(r.get('cpu_gbs'))} | {_f(r.get('cpu_pct_copy'), '{:.1f}')} | "
                f"{_speedup(r, 'speedup_vs_native_cpu')} | "
                f"{_speedup(r, 'speedup_vs_compile_cpu')} |"
            )
    warnings = result.get("warnings") or []
    if warnings:
        lines += ["", f"## Warnings ({len(warnings)})", ""]
        lines += [f"- {w}" for w in warnings]
    plots = result.get("plots") or {}
    if plots:
        lines += ["", "## Plots", ""]
        for name, p in plots.items():
            lines.append(
                f"- {name}: ![{name}]({p['file']})" if "file" in p else f"- {name}: {p['skipped']}"
            )
    return "\n".join(lines) + "\n"


def _pyplot() -> tuple[Any, str | None]:
    """matplotlib's pyplot on the Agg backend, or ``(None, why not)``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return None, (
            f"matplotlib not importable ({type(exc).__name__}: {exc}); "
            "install opcore[bench] for the plots"
        )
    return plt, None


def plot(result: dict[str, Any], path: str, metric: str = "time") -> str | None:
    """One panel per op and layout, one line per provider and peer, against tokens (log
    x): ``metric="time"``, the median time (log y) with its IQR shaded; ``"pct_copy"``,
    the % of the copy bandwidth measured in the run. Returns why no plot was written, or
    None."""
    plt, why = _pyplot()
    if plt is None:
        return why
    recs = [r for r in result["records"] if "skipped" not in r and "error" not in r]
    timer = next((t for t in ("graph", "device") if any(f"{t}_us" in r for r in recs)), "cpu")
    key = f"{timer}_us" if metric == "time" else f"{timer}_pct_copy"
    recs = [r for r in recs if key in r]
    if not recs:
        if metric == "pct_copy":
            return "no copy bandwidth was measured, so no % of it; no PNG"
        return "nothing measured; no PNG"
    panels = sorted({(r["op"], r["layout"]) for r in recs})
    # one colour per provider across panels
    names = sorted({r["provider"] for r in recs})
    colours = {n: f"C{i % 10}" for i, n in enumerate(names)}
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (op, layout) in zip(axes.flat, panels, strict=False):
        mine = [r for r in recs if r["op"] == op and r["layout"] == layout]
        for prov in sorted({r["provider"] for r in mine}):
            # by tokens alone: two hidden sizes may share a layout (records are not ordered)
            pts = sorted(
                ((r["tokens"], r) for r in mine if r["provider"] == prov), key=lambda p: p[0]
            )
            xs = [t for t, _ in pts]
            ax.plot(xs, [r[key] for _, r in pts], marker="o", label=prov, color=colours[prov])
            if metric == "time":
                spreads = [r[f"{timer}_spread"] for _, r in pts]
                ax.fill_between(
                    xs,
                    [s["p25_us"] for s in spreads],
                    [s["p75_us"] for s in spreads],
                    color=colours[prov],
                    alpha=0.2,
                    linewidth=0,
                )
        ax.set_xscale("log")
        if metric == "time":
            ax.set_yscale("log")
            ax.set_ylabel(f"µs ({timer}, median; IQR shaded)")
        else:
            ax.set_ylim(bottom=0)
            ax.set_ylabel(f"% of copy bandwidth ({timer})")
        ax.set_title(f"{op}\n{layout}", fontsize=9)
        ax.set_xlabel("tokens")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    env = result["environment"]
    fig.suptitle(
        f"opcore bench: {env.get('device') or env.get('device_type')} ({env.get('platform')}), "
        f"{env.get('date')}, torch threads {env.get('torch_threads')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return None


def write_all(result: dict[str, Any], out_dir: str) -> dict[str, str]:
    """Write the plots (`PLOTS`), then ``bench.json`` and ``bench.md``, which say which
    plots were written and why any was not (``result["plots"]``). Returns ``{kind: path}``
    and ``{"png_skipped": why}`` when none was written."""
    os.makedirs(out_dir, exist_ok=True)
    paths: dict[str, str] = {}
    plots: dict[str, dict[str, str]] = {}
    for metric, name in PLOTS.items():
        png = os.path.join(out_dir, name)
        why = plot(result, png, metric)
        if why is None:
            plots[metric] = {"file": name}
            paths["png" if metric == "time" else f"png_{metric}"] = png
        else:
            plots[metric] = {"skipped": why}
            if os.path.exists(png):  # an earlier run's plot must not pass for this one's
                os.remove(png)
    if "png" not in paths:
        paths["png_skipped"] = plots["time"]["skipped"]
    result["plots"] = plots
    paths["json"] = os.path.join(out_dir, "bench.json")
    paths["markdown"] = os.path.join(out_dir, "bench.md")
    write_json(result, paths["json"])
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(markdown(result))
    return paths
