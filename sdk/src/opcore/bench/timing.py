"""Timers for `opcore bench`, on any platform, through the `Platform`'s own methods.

- `device_median_us`: median device time per call, from the platform's timing events
  (`Platform.timing_event`) around each call, after overwriting a flush buffer so that
  every call starts with cold caches. Host launch cost shows when it exceeds device time.
- `graph_median_us`: median device time per call replaying a graph of many calls
  (`Platform.capture_graph`): launch gaps removed. ``None`` where the platform has no
  graphs.
- `host_median_us`: median wall time, with the platform's `synchronize` inside the timed
  region when the device runs asynchronously; for devices without timing events.
- `loop_us`: mean time per call over one loop of calls, from the platform's timing events
  around the loop (the host clock around `synchronize` without events); warm caches, no
  flush, so that processes running the loop together (collectives) stay in step.

Each has a ``*_samples_us`` twin returning every sample, from which `spread` gives the
minimum, quartiles, median and repetitions that `opcore bench` records.

`bench_samples_us` is the one procedure `opcore bench` applies to every (op, shape,
provider) and `opcore tune` to every candidate; `compared_timer` names the timer whose
samples the two compare at a token count.

A platform answers which of these apply (`timers`); nothing here names a device type.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

FLUSH_BYTES = 256 << 20  # larger than any last-level cache the ops run against

# The host copy's source: well past a host's last-level cache, quick enough for a CPU.
HOST_COPY_BYTES = 64 << 20

# Spread thresholds, as the interquartile range over the median (``Spread.rel_iqr``).
# Above SPREAD_WARN a measurement is flagged (stderr and the report): its median moves by
# that much between quarters of its samples, so differences smaller than that are noise.
SPREAD_WARN = 0.20
# Above SPREAD_UNUSABLE a speedup against (or of) that measurement is not given: the ratio
# of two medians that each move by half their value says nothing.
SPREAD_UNUSABLE = 0.50


@dataclasses.dataclass(frozen=True)
class Spread:
    """Order statistics of one measurement's samples, in microseconds."""

    min_us: float
    p25_us: float
    median_us: float
    p75_us: float
    reps: int

    @property
    def rel_iqr(self) -> float:
        """``(p75 - p25) / median``: the spread that `SPREAD_WARN` is compared with."""
        return (self.p75_us - self.p25_us) / self.median_us if self.median_us > 0 else math.inf

    def as_dict(self) -> dict[str, float | int]:
        return {**dataclasses.asdict(self), "iqr_over_median": self.rel_iqr}


def spread(samples_us: Sequence[float]) -> Spread:
    """`Spread` of ``samples_us`` (at least one); quartiles interpolate linearly between
    order statistics (``statistics.quantiles(..., method="inclusive")``).

    Raises:
        ValueError: no samples.
    """
    if not samples_us:
        raise ValueError("spread of no samples")
    xs = sorted(samples_us)
    if len(xs) == 1:
        p25 = med = p75 = xs[0]
    else:
        p25, med, p75 = statistics.quantiles(xs, n=4, method="inclusive")
    return Spread(xs[0], p25, med, p75, len(xs))


def host_samples_us(
    fn: Callable[[], object],
    *,
    synchronize: Callable[[], None] | None = None,
    warmup: int = 3,
    reps: int = 20,
    budget_s: float = 1.0,
) -> list[float]:
    """Wall time of each timed ``fn()`` (then ``synchronize()``, when given) in
    microseconds: ``reps`` samples or as many as fit in ``budget_s``, at least three."""
    for _ in range(warmup):
        fn()
    if synchronize is not None:
        synchronize()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < reps and (time.perf_counter() - start) < budget_s or len(samples) < 3:
        t0 = time.perf_counter()
        fn()
        if synchronize is not None:
            synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return samples


def host_median_us(
    fn: Callable[[], object],
    *,
    synchronize: Callable[[], None] | None = None,
    warmup: int = 3,
    reps: int = 20,
    budget_s: float = 1.0,
) -> float:
    """Median of `host_samples_us` (same arguments)."""
    return statistics.median(
        host_samples_us(fn, synchronize=synchronize, warmup=warmup, reps=reps, budget_s=budget_s)
    )


# The name bench/ scripts and earlier results use for the host timer.
cpu_median_us = host_median_us


def event_times_ms(
    platform: Any, calls: list[Callable[[], object]], before: Callable[[], object] | None = None
) -> list[float]:
    """Device milliseconds of each of ``calls``, in order, each between two of
    ``platform``'s timing events (``before()``, when given, runs ahead of each, outside
    the events); one `synchronize` after the last. Calls that differ from each other may be
    mixed in any order (`bench/attention_prefill.py` interleaves providers so)."""
    starts = [platform.timing_event() for _ in calls]
    ends = [platform.timing_event() for _ in calls]
    for call, start, end in zip(calls, starts, ends, strict=True):
        if before is not None:
            before()
        start.record()
        call()
        end.record()
    platform.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def device_samples_us(
    fn: Callable[[], object], platform: Any, *, rep_ms: int = 60, max_reps: int = 1000
) -> list[float]:
    """Device time of each timed ``fn()`` in microseconds, from ``platform``'s timing
    events: about ``rep_ms`` of calls (3 to ``max_reps``), each after a write of
    `FLUSH_BYTES` (outside its events).

    Raises:
        ValueError: ``platform`` has no timing events (`Platform.timing_event` is None).
    """
    if platform.timing_event() is None:
        raise ValueError(f"platform {platform.name!r} has no timing events; use host_median_us")
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=platform.device())
    fn()  # compile or JIT outside the estimate
    estimate_ms = statistics.median(event_times_ms(platform, [fn] * 5))
    reps = min(max_reps, max(3, math.ceil(rep_ms / max(estimate_ms, 1e-3))))
    for _ in range(min(reps, 10)):
        fn()
    return [ms * 1e3 for ms in event_times_ms(platform, [fn] * reps, before=flush.zero_)]


def device_median_us(
    fn: Callable[[], object], platform: Any, *, rep_ms: int = 60, max_reps: int = 1000
) -> float:
    """Median of `device_samples_us` (same arguments and errors)."""
    return statistics.median(device_samples_us(fn, platform, rep_ms=rep_ms, max_reps=max_reps))


def graph_samples_us(
    fn: Callable[[], object], platform: Any, *, rep_ms: int = 60, estimate_us: float | None = None
) -> list[float] | None:
    """Device time per ``fn()`` in microseconds of each replay of a graph of ``n`` calls
    (about 1 ms of work), replayed ten times or for about ``rep_ms``; ``None`` when
    ``platform`` has no graphs or no timing events. ``estimate_us`` (say,
    `device_median_us`) sizes ``n``."""
    if platform.timing_event() is None:
        return None
    per_call = estimate_us if estimate_us is not None else device_median_us(fn, platform, rep_ms=5)
    n = min(200, max(1, math.ceil(1000.0 / max(per_call, 1e-3))))

    def calls() -> None:
        for _ in range(n):
            fn()

    replay = platform.capture_graph(calls)
    if replay is None:
        return None
    replay()
    replays = max(10, min(100, math.ceil(rep_ms * 1e3 / (n * max(per_call, 1e-3)))))
    return [ms * 1e3 / n for ms in event_times_ms(platform, [replay] * replays)]


def graph_median_us(
    fn: Callable[[], object], platform: Any, *, rep_ms: int = 60, estimate_us: float | None = None
) -> float | None:
    """Median of `graph_samples_us` (same arguments), or ``None`` where that is."""
    samples = graph_samples_us(fn, platform, rep_ms=rep_ms, estimate_us=estimate_us)
    return None if samples is None else statistics.median(samples)


def loop_us(
    fn: Callable[[], object],
    platform: Any,
    *,
    iters: int,
    warmup: int,
    ready: Callable[[], object] | None = None,
) -> float:
    """Microseconds per call of ``fn``: ``warmup`` calls, `synchronize`, ``ready()`` (when
    given: say, a barrier so that the ranks of a collective start together), then ``iters``
    calls between two of ``platform``'s timing events, or timed with the host clock up to a
    `synchronize` where the platform has no events.

    Raises:
        ValueError: ``iters`` is not at least 1.
    """
    if iters < 1:
        raise ValueError(f"loop_us: iters is {iters}; expected at least 1")
    for _ in range(warmup):
        fn()
    platform.synchronize()
    if ready is not None:
        ready()
    start, end = platform.timing_event(), platform.timing_event()
    if start is not None and end is not None:
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    platform.synchronize()
    return (time.perf_counter() - t0) * 1e6 / iters


# At or below this many tokens (decode sizes) results compare graph replay, where launch
# gaps would otherwise decide; above it, device time per call after a cache flush.
GRAPH_TOKENS = 32


def bench_samples_us(
    fn: Callable[[], object], platform: Any, timers: str, *, rep_ms: int, graph: bool = True
) -> dict[str, list[float]]:
    """The samples `opcore bench` takes of ``fn()`` with ``timers`` (see `timers`):
    ``{"cpu": host_samples_us(...)}`` with host timers (synchronizing a device that runs
    asynchronously); else ``{"device": device_samples_us(...), "graph": graph_samples_us(...)}``,
    the graph's call count sized from the device median, ``"graph"`` left out where the
    platform has no graphs or ``graph`` is false."""
    if timers == "host":
        sync = platform.synchronize if platform.device_type != "cpu" else None
        return {"cpu": host_samples_us(fn, synchronize=sync)}
    device = device_samples_us(fn, platform, rep_ms=rep_ms)
    out = {"device": device}
    if graph:
        replay = graph_samples_us(
            fn, platform, rep_ms=rep_ms, estimate_us=statistics.median(device)
        )
        if replay is not None:
            out["graph"] = replay
    return out


def compared_timer(samples: Mapping[str, Sequence[float]], tokens: int) -> str:
    """The timer of ``samples`` (a `bench_samples_us` answer) that results compare at
    ``tokens``: ``"graph"`` at or below `GRAPH_TOKENS` where present, else ``"device"``,
    else ``"cpu"``."""
    if tokens <= GRAPH_TOKENS and "graph" in samples:
        return "graph"
    return "device" if "device" in samples else "cpu"


def copy_bandwidth_gbs(platform: Any, nbytes: int = 1 << 31) -> float | None:
    """Device-to-device copy rate on ``platform``'s device, bytes read + written per second
    / 1e9, with the same timer as the ops; ``None`` without timing events."""
    if platform.timing_event() is None:
        return None
    n = nbytes // 2
    src = torch.randn(n, device=platform.device(), dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    us = device_median_us(lambda: dst.copy_(src), platform, rep_ms=100)
    return 2 * nbytes / (us * 1e-6) / 1e9


def host_copy_bandwidth_gbs(
    device: torch.device,
    *,
    synchronize: Callable[[], None] | None = None,
    nbytes: int = HOST_COPY_BYTES,
) -> float:
    """Copy rate on ``device`` timed with the host clock (`host_samples_us`, the timer of
    the ops there), bytes read + written per second / 1e9, from the median; ``nbytes`` is
    the source's size, as in `copy_bandwidth_gbs`."""
    n = nbytes // 4
    src = torch.randn(n, dtype=torch.float32).to(device)  # random on the host: any device
    dst = torch.empty_like(src)
    us = statistics.median(host_samples_us(lambda: dst.copy_(src), synchronize=synchronize))
    return 2 * nbytes / (us * 1e-6) / 1e9


def timers(platform: Any, device: torch.device) -> str:
    """Which timers apply to ``device``: ``"device"`` (the platform's events, and graphs
    where it has them) for a device of ``platform``'s type with timing events, else
    ``"host"``."""
    if device.type == platform.device_type and platform.timing_event() is not None:
        return "device"
    return "host"
