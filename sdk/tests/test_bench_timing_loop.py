"""`opcore.bench.timing.loop_us`, the loop timer the collective benches share, on the CPU
platform (no timing events: the host-clock path): the calls it makes, their order around
``ready``, and its bad input. Its value is a time, so only its sign and order of magnitude
are asserted."""

from __future__ import annotations

import time

import pytest

from opcore.bench.timing import loop_us
from opcore.platforms import get_current_platform


def test_loop_us_warms_up_then_calls_ready_once_then_times_iters_calls() -> None:
    platform = get_current_platform()
    events: list[str] = []
    us = loop_us(
        lambda: events.append("call"),
        platform,
        iters=5,
        warmup=2,
        ready=lambda: events.append("ready"),
    )
    assert events == ["call"] * 2 + ["ready"] + ["call"] * 5
    assert 0.0 < us < 1e6


def test_loop_us_is_the_mean_per_call_on_the_host_clock() -> None:
    us = loop_us(lambda: time.sleep(0.002), get_current_platform(), iters=4, warmup=0)
    assert 2000.0 <= us < 2000.0 * 50  # each call sleeps at least 2 ms; bounded above loosely


def test_loop_us_without_iters_is_an_error_naming_iters() -> None:
    with pytest.raises(ValueError, match="iters is 0"):
        loop_us(lambda: None, get_current_platform(), iters=0, warmup=1)
