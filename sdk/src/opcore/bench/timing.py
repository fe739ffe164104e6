"""Timers for `opcore bench`, on any platform, through the `Platform`'s own methods.

- `device_median_us`: median device time per call, from the platform's timing events
  (`Platform.timing_event`) around each call, after overwriting a flush buffer so that
  every call starts with cold caches. Host launch cost shows when it exceeds device time.
- `graph_median_us`: median device time per call replaying a graph of many calls
  (`Platform.capture_graph`): launch gaps removed. ``None`` where the platform has no
  graphs.
- `host_median_us`: median wall time, with the platform's `synchronize` inside the timed
  region when the device runs asynchronously; for devices without timing events.

A platform answers which of these apply (`timers`); nothing here names a device type.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

FLUSH_BYTES = 256 << 20  # larger than any last-level cache the ops run against


def host_median_us(
    fn: Callable[[], object],
    *,
    synchronize: Callable[[], None] | None = None,
    warmup: int = 3,
    reps: int = 20,
    budget_s: float = 1.0,
) -> float:
    """Median wall time of ``fn()`` (then ``synchronize()``, when given) in microseconds:
    ``reps`` samples or as many as fit in ``budget_s``, at least three."""
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
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


# The name bench/ scripts and earlier results use for the host timer.
cpu_median_us = host_median_us


def _event_times_ms(
    platform: Any, calls: list[Callable[[], object]], before: Callable[[], object] | None = None
) -> list[float]:
    """Device milliseconds of each of ``calls``, each between two timing events
    (``before()``, when given, runs ahead of each, outside the events)."""
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


def device_median_us(
    fn: Callable[[], object], platform: Any, *, rep_ms: int = 60, max_reps: int = 1000
) -> float:
    """Median device time of ``fn()`` in microseconds, from ``platform``'s timing events:
    about ``rep_ms`` of calls (3 to ``max_reps``), each after a write of `FLUSH_BYTES`
    (outside its events).

    Raises:
        ValueError: ``platform`` has no timing events (`Platform.timing_event` is None).
    """
    if platform.timing_event() is None:
        raise ValueError(f"platform {platform.name!r} has no timing events; use host_median_us")
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=platform.device())
    fn()  # compile or JIT outside the estimate
    estimate_ms = statistics.median(_event_times_ms(platform, [fn] * 5))
    reps = min(max_reps, max(3, math.ceil(rep_ms / max(estimate_ms, 1e-3))))
    for _ in range(min(reps, 10)):
        fn()
    return statistics.median(_event_times_ms(platform, [fn] * reps, before=flush.zero_)) * 1e3


def graph_median_us(
    fn: Callable[[], object], platform: Any, *, rep_ms: int = 60, estimate_us: float | None = None
) -> float | None:
    """Median device time per ``fn()`` in microseconds, replaying a graph of ``n`` calls
    (about 1 ms of work) ten times or for about ``rep_ms``; ``None`` when ``platform`` has no
    graphs or no timing events. ``estimate_us`` (say, `device_median_us`) sizes ``n``."""
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
    return statistics.median(_event_times_ms(platform, [replay] * replays)) * 1e3 / n


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


def timers(platform: Any, device: torch.device) -> str:
    """Which timers apply to ``device``: ``"device"`` (the platform's events, and graphs
    where it has them) for a device of ``platform``'s type with timing events, else
    ``"host"``."""
    if device.type == platform.device_type and platform.timing_event() is not None:
        return "device"
    return "host"
