"""One timing loop for the decode-size benches (`gated_decode.py`, `norm_decode.py`): each
callable timed ``rounds`` times, the order rotated every round (`opcore.bench.runner.rotated`:
each is timed first once in as many rounds as callables), by graph replay where the device
has timing events (`opcore.bench.timing.graph_median_us`: launch gaps removed) and by the
host clock otherwise; the median of each callable's round medians. `where` picks the
device and the timer. ``flushed`` instead times each call between events after a cache
flush (`opcore.bench.timing.device_median_us`, `opcore bench`'s timer past 32 tokens): a
graph replayed in a loop keeps the rows' data in L2, which a model's step does not."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any


def medians_us(
    fns: dict[str, Callable[[], object]], platform: Any, timers: str, rounds: int, rep_ms: int = 20
) -> dict[str, float]:
    """``{name: median us}`` for ``fns`` (``timers``: `opcore.bench.timing.timers`' answer, or
    ``"flushed"``)."""
    from opcore.bench import timing
    from opcore.bench.runner import rotated

    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for name in rotated(list(fns), r):
            if timers == "device":
                us = timing.graph_median_us(fns[name], platform, rep_ms=rep_ms)
            elif timers == "flushed":
                us = timing.device_median_us(fns[name], platform, rep_ms=rep_ms)
            else:
                us = timing.host_median_us(fns[name], reps=5)
            times[name].append(us)
    return {k: round(statistics.median(v), 4) for k, v in times.items()}


def timed_row(
    fields: dict[str, Any],
    fns: dict[str, Callable[[], object]],
    platform: Any,
    timers: str,
    rounds: int,
) -> dict[str, Any]:
    """One result row: ``fields``, the timer used (``"graph"``, ``"flushed"`` or ``"host"``)
    and `medians_us` of ``fns``."""
    row = {**fields, "timer": {"device": "graph", "flushed": "flushed"}.get(timers, "host")}
    row.update(medians_us(fns, platform, timers, rounds))
    return row


def where(quick: bool) -> tuple[Any, Any, str]:
    """``(platform, device, timers)``: the current platform's device 0, or the host CPU under
    ``--quick`` (Triton's interpreter), and `opcore.bench.timing.timers`' answer for it."""
    import torch

    from opcore.bench import timing
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    device = torch.device("cpu") if quick else torch.device(platform.device_type, 0)
    return platform, device, timing.timers(platform, device)
