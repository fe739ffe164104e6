"""Eager dispatch overhead of `opcore.ir` ops (<= 1 us: docs/design.md#performance-targets).

Measures, on the CPU with tiny tensors:

1. ``ops.rms_norm(x, w, eps)`` against calling the provider that dispatch chose
   (``ops.rms_norm.dispatch(...).impl_fn``) directly; the difference is the overhead
   (tracing check, argument validation, cached priority lookup, call forwarding).
2. The same with a provider that returns its input at once, so the provider's own time
   (and its noise) does not hide the overhead.
3. The parts: the tracing check, validation, ``dispatch()``.
4. A no-op provider with a ``supports_args`` (the path of a GPU provider such as ``triton``),
   and, where `opcore.tuning` exists, the same when a tuning table puts another provider
   first for the bucket (the router dispatch adds for such an op; docs/tuning.md).

Timing: ``timeit`` with the two callables interleaved, best of ``--repeat`` rounds of
``--number`` calls each, timed by the thread's CPU time (``time.thread_time``) so that
other processes on a shared machine do not inflate the numbers; ``--wall`` uses
``time.perf_counter`` instead.

    python bench/dispatch_overhead.py [--number 20000] [--repeat 15] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
import timeit

import torch

import opcore
from opcore.ir import all_ops, ops
from opcore.ir.dispatch import is_tracing
from opcore.testing.ir import temporary_impl

TIMER = time.thread_time


def _best_pair(a, b, number: int, repeat: int) -> tuple[float, float]:
    """Best per-call seconds of ``a`` and of ``b``, measured interleaved."""
    best_a = best_b = float("inf")
    for _ in range(repeat):
        best_a = min(best_a, timeit.timeit(a, number=number, timer=TIMER) / number)
        best_b = min(best_b, timeit.timeit(b, number=number, timer=TIMER) / number)
    return best_a, best_b


def _best(a, number: int, repeat: int) -> float:
    return min(timeit.timeit(a, number=number, timer=TIMER) / number for _ in range(repeat))


def rms_norm(x, weight, epsilon, variance_size=None):
    """A provider that does no work: what remains of a call is dispatch overhead."""
    return x


def _noop_provider(op):
    """A no-op provider for any op (its signature is the native one via ``__wrapped__``)."""
    arity = (
        len(op.native.__annotations__.get("return", "").split(","))
        if "tuple" in str(op.native.__annotations__.get("return", ""))
        else 1
    )

    def noop(*args, **kwargs):
        return args[0] if arity == 1 else tuple(args[:arity])

    noop.__wrapped__ = op.native
    return noop


def _rms_norm_rows(shape: tuple[int, ...], number: int, repeat: int) -> list[dict]:
    x = torch.randn(shape)
    w = torch.rand(shape[-1]) + 0.5
    eps = 1e-6
    impl = ops.rms_norm.dispatch(x, w, eps)
    direct_fn = impl.impl_fn
    rows = []
    op_t, direct_t = _best_pair(
        lambda: ops.rms_norm(x, w, eps), lambda: direct_fn(x, w, eps), number, repeat
    )
    rows.append(
        {
            "case": f"rms_norm {list(shape)} fp32, provider {impl.provider!r}",
            "op_us": op_t * 1e6,
            "direct_us": direct_t * 1e6,
        }
    )
    # control: the same provider under two names shows the run-to-run spread
    alias = impl.functional
    a_t, b_t = _best_pair(lambda: alias(x, w, eps), lambda: direct_fn(x, w, eps), number, repeat)
    rows.append(
        {
            "case": f"control: provider {impl.provider!r} vs itself (noise floor)",
            "op_us": a_t * 1e6,
            "direct_us": b_t * 1e6,
        }
    )
    with (
        temporary_impl(ops.rms_norm, "bench_noop", rms_norm),
        ops.rms_norm.set_priority(["bench_noop"]),
    ):
        assert ops.rms_norm.dispatch(x, w, eps).provider == "bench_noop"
        op_t, direct_t = _best_pair(
            lambda: ops.rms_norm(x, w, eps), lambda: rms_norm(x, w, eps), number, repeat
        )
        rows.append(
            {
                "case": f"rms_norm {list(shape)} fp32, no-op provider",
                "op_us": op_t * 1e6,
                "direct_us": direct_t * 1e6,
            }
        )
    return rows


def _other_op_rows(number: int, repeat: int) -> list[dict]:
    """Every other op with a no-op provider, on its first quick sample."""
    rows = []
    for name, op in all_ops().items():
        if name == "rms_norm":
            continue
        sample = next(iter(op.sample_inputs("cpu", torch.float32)))
        args = sample.args
        noop = _noop_provider(op)
        with temporary_impl(op, "bench_noop", noop), op.set_priority(["bench_noop"]):
            op_t, direct_t = _best_pair(
                lambda op=op, args=args: op(*args),
                lambda noop=noop, args=args: noop(*args),
                number,
                repeat,
            )
        rows.append(
            {
                "case": f"{name} sample {sample.name!r}, no-op provider",
                "op_us": op_t * 1e6,
                "direct_us": direct_t * 1e6,
            }
        )
    return rows


def _accepts(x, weight, epsilon, variance_size=None) -> bool:
    return True


def rms_norm_routed(x, weight, epsilon, variance_size=None):
    """Another no-op provider: the one a tuning table puts first."""
    return x


def _supports_args_rows(number: int, repeat: int) -> list[dict]:
    x, w, eps = torch.randn(4, 64), torch.rand(64) + 0.5, 1e-6
    with (
        temporary_impl(ops.rms_norm, "bench_noop", rms_norm, supports_args=_accepts),
        ops.rms_norm.set_priority(["bench_noop"]),
    ):
        op_t, direct_t = _best_pair(
            lambda: ops.rms_norm(x, w, eps), lambda: rms_norm(x, w, eps), number, repeat
        )
    return [
        {
            "case": "rms_norm [4, 64] fp32, no-op provider with supports_args",
            "op_us": op_t * 1e6,
            "direct_us": direct_t * 1e6,
        }
    ]


def _tuning_rows(number: int, repeat: int) -> list[dict]:
    """A table that reorders rms_norm's bucket: dispatch goes through the router. The
    platform's default order is replaced for the measurement (a user list would switch
    routing off: the user disposes)."""
    try:
        from opcore import tuning
        from opcore.tuning import table
    except ImportError:  # a tree without tuning
        return []
    import json
    import os
    import tempfile

    from opcore.platforms import get_current_platform

    x, w, eps = torch.randn(4, 64), torch.rand(64) + 0.5, 1e-6
    cls = type(get_current_platform())
    saved = cls.get_default_ir_op_priority
    old_env = os.environ.get(tuning.ENV)
    with (
        temporary_impl(ops.rms_norm, "bench_noop", rms_norm, supports_args=_accepts),
        temporary_impl(ops.rms_norm, "bench_routed", rms_norm_routed, supports_args=_accepts),
        tempfile.TemporaryDirectory() as tmp,
    ):
        cls.get_default_ir_op_priority = lambda self, config: {
            "rms_norm": ["bench_noop", "bench_routed"]
        }
        ids = {p: ops.rms_norm.identity_hash(p) for p in ("bench_noop", "bench_routed")}
        doc = {
            "format": table.FORMAT,
            "version": table.VERSION,
            "environment": tuning.environment(),
            "providers": {"rms_norm": ids},
            "entries": [
                {
                    "op": "rms_norm",
                    "dtype": "float32",
                    "tokens": 4,
                    "shape": [64],
                    "order": ["bench_routed", "bench_noop"],
                    "configs": {},
                }
            ],
        }
        path = os.path.join(tmp, "table.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        os.environ[tuning.ENV] = path
        try:
            tuning.reload()
            assert ops.rms_norm.dispatch(x, w, eps).provider == "bench_routed"
            op_t, direct_t = _best_pair(
                lambda: ops.rms_norm(x, w, eps),
                lambda: rms_norm_routed(x, w, eps),
                number,
                repeat,
            )
        finally:
            cls.get_default_ir_op_priority = saved
            if old_env is None:
                os.environ.pop(tuning.ENV, None)
            else:
                os.environ[tuning.ENV] = old_env
            tuning.reload()
    return [
        {
            "case": "rms_norm [4, 64] fp32, tuning table routes the bucket to a no-op provider",
            "op_us": op_t * 1e6,
            "direct_us": direct_t * 1e6,
        }
    ]


def measure(number: int, repeat: int) -> list[dict]:
    torch.set_num_threads(1)
    rows = _rms_norm_rows((1, 8), number, repeat) + _rms_norm_rows((4, 64), number, repeat)
    x, w = torch.randn(1, 8), torch.rand(8)
    args = (x, w, 1e-6)
    validator = ops.rms_norm.validator
    parts = {
        "tracing check": _best(lambda: is_tracing(args), number, repeat),
        "rms_norm validator": _best(lambda: validator(*args), number, repeat),
        "dispatch()": _best(lambda: ops.rms_norm.dispatch(*args), number, repeat),
        "empty lambda (loop cost)": _best(lambda: None, number, repeat),
    }
    for name, t in parts.items():
        rows.append({"case": f"part: {name}", "op_us": t * 1e6, "direct_us": None})
    rows += _supports_args_rows(number, repeat) + _tuning_rows(number, repeat)
    return rows + _other_op_rows(number, repeat)


def environment() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "machine": f"{cpu}, {torch.get_num_threads()} torch thread(s)",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "opcore": opcore.__version__,
    }


def to_markdown(rows: list[dict], env: dict[str, str], number: int, repeat: int) -> str:
    lines = ["# Eager dispatch overhead of `ops.rms_norm`", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    timer = (
        "wall clock (perf_counter)"
        if TIMER is time.perf_counter
        else "thread CPU time (thread_time)"
    )
    lines += [
        f"- method: `python bench/dispatch_overhead.py --number {number} --repeat {repeat}`; "
        f"best of the rounds, op and direct call interleaved, timed by {timer}",
        "",
    ]
    lines += [
        "| case | ops.rms_norm (us) | provider called directly (us) | overhead (us) |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        if r["direct_us"] is None:
            lines.append(f"| {r['case']} | {r['op_us']:.3f} | | |")
        else:
            lines.append(
                f"| {r['case']} | {r['op_us']:.3f} | {r['direct_us']:.3f} | "
                f"{r['op_us'] - r['direct_us']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument(
        "--wall", action="store_true", help="time wall clock instead of thread CPU time"
    )
    args = parser.parse_args(argv)
    global TIMER
    if args.wall:
        TIMER = time.perf_counter
    rows = measure(args.number, args.repeat)
    text = to_markdown(rows, environment(), args.number, args.repeat)
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
