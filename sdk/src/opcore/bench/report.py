"""Outputs of `opcore bench`: JSON (everything), a Markdown table, a PNG plot."""

from __future__ import annotations

import json
import os
from typing import Any


def write_json(result: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


def _f(v, fmt="{:.2f}") -> str:
    return "" if v is None else fmt.format(v)


def markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        "# opcore bench",
        "",
        ", ".join(f"{k}: {v}" for k, v in env.items() if k != "copy_gbs")
        + (f", copy bandwidth: {env['copy_gbs']:.0f} GB/s" if env.get("copy_gbs") else ""),
        "",
    ]
    recs = result["records"]
    gpu = any("device_us" in r for r in recs)  # the platform's timing events were used
    if gpu:
        head = (
            "| op | layout | tokens | provider | device µs | graph µs | GB/s | % copy "
            "| × native (graph) | × compile (graph) | × compile (device) |"
        )
        lines += [head, "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    else:
        lines += [
            "| op | layout | tokens | provider | host µs | × native | × compile |",
            "|---|---|---:|---|---:|---:|---:|",
        ]
    for r in recs:
        row = f"| {r['op']} | {r['layout']} | {r['tokens']} | {r['provider']} |"
        if "skipped" in r or "error" in r:
            note = r.get("skipped") or ("error: " + r["error"])
            ncols = 7 if gpu else 3
            lines.append(row + f" {note} |" + " |" * (ncols - 1))
            continue
        if gpu:
            lines.append(
                row + f" {_f(r.get('device_us'))} | {_f(r.get('graph_us'))} | "
                f"{_f(r.get('device_gbs'), '{:.0f}')} | {_f(r.get('device_pct_copy'), '{:.1f}')} | "
                f"{_f(r.get('speedup_vs_native_graph'))} | "
                f"{_f(r.get('speedup_vs_compile_graph'))} | "
                f"{_f(r.get('speedup_vs_compile_device'))} |"
            )
        else:
            lines.append(
                row + f" {_f(r.get('cpu_us'), '{:.1f}')} | "
                f"{_f(r.get('speedup_vs_native_cpu'))} | {_f(r.get('speedup_vs_compile_cpu'))} |"
            )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: str) -> str | None:
    """One panel per op and layout: time against tokens per provider (log-log). Returns
    why no plot was written, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"matplotlib not importable ({type(exc).__name__}); no PNG"
    recs = [r for r in result["records"] if "skipped" not in r and "error" not in r]
    key = next((k for k in ("graph_us", "device_us") if any(k in r for r in recs)), "cpu_us")
    panels = sorted({(r["op"], r["layout"]) for r in recs})
    if not panels:
        return "nothing measured; no PNG"
    # one colour per provider across panels
    names = sorted({r["provider"] for r in recs})
    colours = {n: f"C{i % 10}" for i, n in enumerate(names)}
    cols = 4
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (op, layout) in zip(axes.flat, panels, strict=False):
        for prov in sorted(
            {r["provider"] for r in recs if r["op"] == op and r["layout"] == layout}
        ):
            pts = sorted(
                (r["tokens"], r[key])
                for r in recs
                if r["op"] == op and r["layout"] == layout and r["provider"] == prov and key in r
            )
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    marker="o",
                    label=prov,
                    color=colours[prov],
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{op}\n{layout}", fontsize=9)
        ax.set_xlabel("tokens")
        ax.set_ylabel("µs (" + key.removesuffix("_us") + ")")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return None


def write_all(result: dict[str, Any], out_dir: str) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "json": os.path.join(out_dir, "bench.json"),
        "markdown": os.path.join(out_dir, "bench.md"),
    }
    write_json(result, paths["json"])
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(markdown(result))
    png = os.path.join(out_dir, "bench.png")
    why = plot(result, png)
    if why is None:
        paths["png"] = png
    else:
        paths["png_skipped"] = why
    return paths
