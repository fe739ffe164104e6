"""`opcore bench`: time every op x provider x shape on the current platform's device.

Writes ``bench.json`` (all records and the environment), ``bench.md`` (a table) and
``bench.png`` (when matplotlib imports) to ``--out``. On a GPU each case gets the median of
`triton.testing.do_bench` and of CUDA-graph replay, GB/s and % of the copy bandwidth
measured in the same run, and speedups against native eager and torch.compile. On a CPU
(``--quick`` for small shapes) it reports timings only.
"""

from __future__ import annotations

import argparse

from opcore.bench import cases


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="time ops x providers x shapes (JSON, Markdown, PNG)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--ops", type=_names, default=cases.OPS, help="comma-separated ops (default: all six)")
    p.add_argument("--providers", type=_names, default=None,
                   help="only these providers/baselines (e.g. triton,native,compile,F.rms_norm,liger,triton-unfused)")
    p.add_argument("--tokens", type=_ints, default=None,
                   help=f"token counts (default: {','.join(map(str, cases.DECODE_TOKENS + cases.PREFILL_TOKENS))})")
    p.add_argument("--hidden", type=_ints, default=None,
                   help=f"hidden sizes (default: {','.join(map(str, cases.HIDDEN))})")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--device", default=None, help="torch device (default: the current platform's)")
    p.add_argument("--quick", action="store_true",
                   help=f"small shapes for a CPU: tokens {cases.QUICK_TOKENS}, hidden {cases.QUICK_HIDDEN}")
    p.add_argument("--rep-ms", type=int, default=60, help="milliseconds per timer per case (GPU)")
    p.add_argument("--out", default="opcore-bench", help="output directory (default: ./opcore-bench)")
    p.add_argument("--jsonl", default=None,
                   help="also append each record to this JSON Lines file as it is measured")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from opcore.bench import report, runner

    unknown = [o for o in args.ops if o not in cases.OPS]
    if unknown:
        raise SystemExit(f"opcore bench: unknown op(s) {', '.join(unknown)}; known: {', '.join(cases.OPS)}")
    if args.device is None:
        from opcore.platforms import get_current_platform

        device = str(get_current_platform().device())
    else:
        device = args.device
    from opcore.ir import priority  # the ops; loading the platform's kernels registers providers

    priority.ensure_kernels_loaded()
    default_tokens = cases.QUICK_TOKENS if args.quick else cases.DECODE_TOKENS + cases.PREFILL_TOKENS
    default_hidden = cases.QUICK_HIDDEN if args.quick else cases.HIDDEN
    opts = runner.Options(
        ops=tuple(args.ops),
        tokens=args.tokens or default_tokens,
        hidden=args.hidden or default_hidden,
        providers=set(args.providers) if args.providers else None,
        dtype=getattr(torch, args.dtype),
        device=device,
        quick=args.quick,
        rep_ms=args.rep_ms,
        jsonl=args.jsonl,
    )
    result = runner.run(opts)
    paths = report.write_all(result, args.out)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    errors = [r for r in result["records"] if "error" in r]
    return 1 if errors else 0
