"""`opcore bench`: time every op x provider x shape on the current platform's device.

Writes ``bench.json`` (the environment and every record), ``bench.md`` (a report) and, when
matplotlib imports (``opcore[bench]``), ``bench.png`` (time against tokens) and
``bench_pct_copy.png`` (% of copy bandwidth) to ``--out``. Every time is a median with its
spread (min, p25, p75, repetitions); large spreads are warned about. On a device whose
platform has timing events each case gets the median device time (events, caches flushed)
and, where the platform has graphs, of graph replay; on the host CPU (``--quick`` for small
shapes) wall-clock time with torch's thread count pinned (``--threads``). GB/s and % of a
copy's bandwidth measured in the same run, speedups against native eager and
torch.compile from the medians. Exit status: 0, 1 when a case failed, 2 on bad arguments.
Torch loads only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from opcore.bench import shapes as cases  # torch-free: help quotes the shape sets
from opcore.cli.argtypes import positive_int

MAX_WARNING_LINES = 20  # warnings on stderr; the report lists every one


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="time ops x providers x shapes (JSON, Markdown, PNG)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument(
        "--ops",
        type=_names,
        default=cases.OPS,
        help=f"comma-separated ops (default: {','.join(cases.OPS)})",
    )
    p.add_argument(
        "--providers",
        type=_names,
        default=None,
        help="only these providers/baselines "
        "(e.g. triton,native,compile,F.rms_norm,liger,flaggems,triton-unfused)",
    )
    p.add_argument(
        "--tokens",
        type=_ints,
        default=None,
        help="token counts (default: "
        f"{','.join(map(str, cases.DECODE_TOKENS + cases.PREFILL_TOKENS))})",
    )
    p.add_argument(
        "--hidden",
        type=_ints,
        default=None,
        help=f"hidden sizes (default: {','.join(map(str, cases.HIDDEN))})",
    )
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--device", default=None, help="torch device (default: the current platform's)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"small shapes for a CPU: tokens {cases.QUICK_TOKENS}, hidden {cases.QUICK_HIDDEN}",
    )
    p.add_argument(
        "--rep-ms",
        type=positive_int,
        default=60,
        help="milliseconds per timer per case (device timers; a positive integer)",
    )
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="time each case's providers this many times, the order rotated each round, "
        "and pool the samples (a device favours whichever runs first; default 1)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads for the run, restored after it (default on the host cpu: "
        "min(physical cores, 8); elsewhere left as it is)",
    )
    p.add_argument(
        "--out",
        default="opcore-bench",
        help="output directory, created if missing (default: ./opcore-bench)",
    )
    p.add_argument(
        "--jsonl",
        default=None,
        help="also append each record to this JSON Lines file as it is measured",
    )
    att = p.add_argument_group("decode attention (instead of the ops)")
    att.add_argument(
        "--decode-attention",
        action="store_true",
        help="time paged decode attention against SDPA over the same KV "
        "(writes attention.json and attention.md)",
    )
    att.add_argument(
        "--backend",
        default=None,
        help="attention backend (default: the one the selector picks here)",
    )
    att.add_argument(
        "--batches", type=_ints, default=None, help="batch sizes (default: 1,8,32,64,128,256)"
    )
    att.add_argument(
        "--contexts",
        type=_ints,
        default=None,
        help="context lengths (default: 1024,4096,16384,32768)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from opcore.bench import report, runner
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    try:
        device = runner.bench_device(platform, args.device)
    except ValueError as exc:
        print(f"opcore bench: error: argument --device: {exc}", file=sys.stderr)
        return 2
    problem = _out_problem(args.out)
    if problem is not None:  # before measuring: a run must not be lost to where it goes
        print(f"opcore bench: error: argument --out: {problem}", file=sys.stderr)
        return 2
    if args.decode_attention:
        return _run_decode_attention(args, platform, device)

    # the ops; loading the platform's kernels registers its providers
    from opcore.ir import ensure_kernels_loaded

    ensure_kernels_loaded()
    try:  # a typo must not pass for "nothing to time" (an empty table and exit 0)
        runner.check_selection(tuple(args.ops), set(args.providers or ()), platform.name)
    except runner.UnknownNameError as exc:
        print(f"opcore bench: error: argument {exc.flag}: {exc}", file=sys.stderr)
        return 2
    default_tokens = (
        cases.QUICK_TOKENS if args.quick else cases.DECODE_TOKENS + cases.PREFILL_TOKENS
    )
    default_hidden = cases.QUICK_HIDDEN if args.quick else cases.HIDDEN
    opts = runner.Options(
        ops=tuple(args.ops),
        tokens=args.tokens or default_tokens,
        hidden=args.hidden or default_hidden,
        providers=set(args.providers) if args.providers else None,
        dtype=getattr(torch, args.dtype),
        device=str(device),
        quick=args.quick,
        rep_ms=args.rep_ms,
        rounds=args.rounds,
        jsonl=args.jsonl,
        threads=args.threads,
    )
    result = runner.run(opts, platform=platform)
    try:
        paths = report.write_all(result, args.out)
    except OSError as exc:  # changed during the run (checked before it)
        kept = f"; the records measured are in {args.jsonl}" if args.jsonl else ""
        print(f"opcore bench: error: argument --out: cannot write: {exc}{kept}", file=sys.stderr)
        return 2
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    warnings = result["warnings"]
    for line in warnings[:MAX_WARNING_LINES]:
        print(f"opcore bench: warning: {line}", file=sys.stderr)
    if len(warnings) > MAX_WARNING_LINES:
        print(
            f"opcore bench: warning: {len(warnings) - MAX_WARNING_LINES} more warnings "
            f"(all listed in {paths['markdown']})",
            file=sys.stderr,
        )
    errors = [r for r in result["records"] if "error" in r]
    return 1 if errors else 0


def _out_problem(out: str) -> str | None:
    """Why the reports cannot go to directory ``out``, or ``None``: it, or the nearest
    of its parents that exists, must be a directory."""
    path = os.path.abspath(out)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    if os.path.isdir(path):
        return None
    if path == os.path.abspath(out):
        return f"{out!r} exists and is not a directory (the reports go into a directory)"
    return f"{out!r} cannot be a directory: {path!r} is not a directory"


def _run_decode_attention(args: argparse.Namespace, platform, device) -> int:
    """Decode attention: one backend over batch x context, with the copy bandwidth measured
    in the same run where the platform has timing events (`opcore.attention.bench`)."""
    import json

    import torch

    from opcore.attention import bench as att_bench
    from opcore.attention.selector import probe_selection
    from opcore.bench import runner, timing

    dtype = getattr(torch, args.dtype)
    backend = args.backend or probe_selection()["selected"]
    quick = args.quick or device.type == "cpu"
    batches = args.batches or (att_bench.QUICK_BATCHES if quick else att_bench.BATCHES)
    contexts = args.contexts or (att_bench.QUICK_CONTEXTS if quick else att_bench.CONTEXTS)
    timers = timing.timers(platform, device)
    copy_gbs = timing.copy_bandwidth_gbs(platform) if timers == "device" else None
    records = att_bench.decode_attention_records(
        batches, contexts, backend=backend, device=device, dtype=dtype,
        copy_gbs=copy_gbs, rep_ms=args.rep_ms, log=print, platform=platform,
    )  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    env = {**runner.environment(device, platform), "timers": timers}
    result = {"environment": env, "copy_gbs": copy_gbs, "records": records}
    json_path = os.path.join(args.out, "attention.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, default=str)
    md_path = os.path.join(args.out, "attention.md")
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(f"# decode attention: {backend} on {device}\n\n")
        f.writelines(f"    {att_bench.format_record(r)}\n" for r in records)
    print(f"json: {json_path}\nmarkdown: {md_path}")
    return 1 if any("error" in r for r in records) else 0
