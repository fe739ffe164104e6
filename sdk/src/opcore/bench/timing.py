"""Timers. GPU: median of `triton.testing.do_bench` (events around each call after an L2
flush; host launch cost shows when it exceeds device time) and median of CUDA-graph
replay (`do_bench_cudagraph`: device time, launch gaps removed). CPU: median wall time."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def cpu_median_us(fn: Callable[[], object], *, warmup: int = 3, reps: int = 20, budget_s: float = 1.0) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    start = time.perf_counter()
    while len(samples) < reps and (time.perf_counter() - start) < budget_s or len(samples) < 3:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def gpu_do_bench_us(fn: Callable[[], object], *, rep_ms: int = 60) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")) * 1e3


def gpu_graph_us(fn: Callable[[], object], *, rep_ms: int = 60) -> float:
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")) * 1e3


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 1 << 31) -> float:
    """Device-to-device copy rate, bytes read + written per second / 1e9, same timer as the ops."""
    n = nbytes // 2
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    us = gpu_do_bench_us(lambda: dst.copy_(src), rep_ms=100)
    return 2 * nbytes / (us * 1e-6) / 1e9
