"""`opcore tune`: measure, per op x shape bucket x dtype, the fastest correct launch choice.

Every candidate (each provider that accepts the arguments, with its heuristic and each
configuration of its declared launch space) is checked against the float64 reference
with the conformance suite's error budget before it is timed; a wrong one is recorded as
rejected and never chosen. Timing is device time (graph replay at decode sizes where the
platform has graphs); a choice replaces the heuristic only when it is faster beyond
noise. Writes a tuning table (JSON; docs/tuning.md) to ``--out``, by default into the user
cache dir, where dispatch finds it. Torch loads only when the command runs.

Failures are one line on stderr: a bad flag value (``--budget-s``, ``--rep-ms``: positive
and finite; ``--ops``: registered ops with a bucket key; ``--out``: a file that can be
written, never an existing directory) is refused before anything is measured, exit 2.
SIGINT or SIGTERM stops the search: the buckets measured so far are written, marked
incomplete, and the exit status is 128 + the signal's number (130 for SIGINT, 143 for
SIGTERM), the convention ``opcore conformance`` follows.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from types import FrameType
from typing import Any

from opcore.bench import shapes

DTYPES = ("bfloat16", "float16", "float32")


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def _positive_finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def _dtypes(text: str) -> tuple[str, ...]:
    names = _names(text)
    bad = [n for n in names if n not in DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {bad}; choose from {DTYPES}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tune",
        help="measure and write a tuning table (correctness-gated launch choices per shape)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--ops", type=_names, default=shapes.OPS, help="comma-separated ops")
    p.add_argument(
        "--tokens",
        type=_ints,
        default=(1, 32, 4096, 32768),
        help="token counts, one bucket each (default: 1,32,4096,32768)",
    )
    p.add_argument(
        "--hidden",
        type=_ints,
        default=shapes.HIDDEN,
        help="model hidden sizes; activations and heads follow the bench's Llama layouts "
        f"(default: {','.join(map(str, shapes.HIDDEN))})",
    )
    p.add_argument("--dtypes", type=_dtypes, default=("bfloat16",), help="default: bfloat16")
    p.add_argument(
        "--budget-s",
        type=_positive_finite,
        default=180.0,
        help="wall-clock budget of the whole search, in seconds, positive and finite "
        "(default: 180)",
    )
    p.add_argument("--out", default=None, help="table path (default: the user cache dir)")
    p.add_argument(
        "--providers", type=_names, default=None, help="only these providers (default: all)"
    )
    p.add_argument(
        "--properties",
        type=_names,
        default=(),
        help="properties the choice must keep across sizes (batch_invariant: one "
        "reduction order per shape for every token bucket)",
    )
    p.add_argument(
        "--rep-ms",
        type=_positive_finite,
        default=60.0,
        help="milliseconds per timer per candidate, positive and finite (device timers; "
        "opcore bench's default, so that both take the same samples)",
    )
    p.add_argument("--quick", action="store_true", help="the bench's small CPU shapes")
    p.set_defaults(run=run)


class _Interrupted(KeyboardInterrupt):
    """What the handler raises: a `KeyboardInterrupt` (for SIGTERM too), so code the search
    runs lets it pass (``except Exception`` does not take it)."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


class _Signals:
    """SIGINT and SIGTERM while `opcore tune` runs. While ``raising``, a signal raises
    `_Interrupted` where the main thread is; the search sets ``raising`` to False once it
    turns to writing the table, after which a signal is only recorded. ``signal_name``:
    the first one received. Only the main thread can install handlers; elsewhere the
    default behaviour stays."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.raising = True
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._previous[s] = signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
        if self.raising:
            raise _Interrupted(self.signal_name)


def _signal_status(name: str) -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(getattr(signal, name))


def _error(message: str) -> int:
    print(f"opcore tune: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    with _Signals() as signals:
        try:
            return _run(args, signals)
        except KeyboardInterrupt as exc:  # before the search started, or after it wrote
            name = getattr(exc, "signal_name", None) or signals.signal_name or "SIGINT"
            signals.raising = False
            print(
                f"opcore tune: interrupted by {name} before any bucket was measured; "
                f"nothing written",
                file=sys.stderr,
            )
            return _signal_status(name)


def _run(args: argparse.Namespace, signals: _Signals) -> int:
    import torch

    from opcore.ir import all_ops, get_op
    from opcore.platforms.kernels import ensure_kernels_loaded
    from opcore.properties import check_names
    from opcore.tuner import search
    from opcore.tuning import table
    from opcore.tuning.buckets import key_function

    if args.out is not None:
        problem = table.out_problem(args.out)
        if problem is not None:  # before measuring: a run must not be lost to where it goes
            return _error(f"argument --out: {problem}")
    try:
        props = tuple(check_names(args.properties, where="opcore tune --properties"))
    except ValueError as exc:
        return _error(str(exc))
    ensure_kernels_loaded()  # plugins' ops and bucket keys, before --ops is checked
    tunable = ", ".join(n for n in sorted(all_ops()) if key_function(n) is not None)
    for name in args.ops:
        try:
            get_op(name)  # collective ops too: not tunable, but registered
        except AttributeError:
            return _error(f"argument --ops: {name!r} is not a registered op; tunable: {tunable}")
        if key_function(name) is None:
            return _error(
                f"argument --ops: op {name!r} has no shape bucket key to tune by; "
                f"tunable: {tunable}"
            )
    opts = search.Options(
        ops=args.ops,
        tokens=args.tokens,
        hidden=args.hidden,
        dtypes=tuple(getattr(torch, d) for d in args.dtypes),
        budget_s=args.budget_s,
        out=args.out,
        quick=args.quick,
        providers=args.providers,
        properties=props,
        rep_ms=args.rep_ms,
        log=lambda line: print(line, flush=True),
    )
    try:
        doc = search.run(opts, interruptions=signals)
    except ValueError as exc:
        return _error(str(exc))
    except OSError as exc:  # the path changed during the run (it was checked before)
        return _error(f"the table could not be written: {exc}")
    entries = doc["entries"]
    s = doc["search"]
    if s["interrupted"] and doc["path"] is None:
        print(
            f"opcore tune: interrupted by {s['interrupted']} before any bucket was measured; "
            f"nothing written",
            file=sys.stderr,
        )
        return _signal_status(s["interrupted"])
    if s["interrupted"]:
        print(
            f"opcore tune: interrupted by {s['interrupted']}: the {len(entries)} bucket(s) "
            f"measured are written to {doc['path']}, marked incomplete; "
            f"{len(s['not_measured'])} not measured",
            file=sys.stderr,
        )
        return _signal_status(s["interrupted"])
    rejected = sum(len(e["rejected"]) for e in entries)
    changed = sum(
        1
        for e in entries
        if e["order"] and (e["order"][0] != e["incumbent"] or e["best"][e["order"][0]]["config"])
    )
    print(
        f"opcore tune: {len(entries)} bucket(s), {changed} changed from the heuristic, "
        f"{rejected} candidate(s) rejected by the gate, {s['spent_s']} s of {s['budget_s']} s; "
        f"{len(s['skipped_for_budget'])} bucket(s) skipped for the budget"
    )
    print(f"opcore tune: table written to {doc['path']}")
    return 0
