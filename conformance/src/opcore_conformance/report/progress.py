"""A progress bar on stderr: redrawn in place on a terminal, a line per 10 % otherwise
(CI logs)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from opcore_conformance import status as S

# Rough relative cost of one case by check (a numerics case is 1): torch.compile dominates a
# run, Inductor's code generation most of all. Only the bar's fill uses these.
_COSTS = (("compile.", 12.0), ("opcheck", 4.0), ("layers", 2.0), ("attention", 2.0))
_INDUCTOR = 4.0  # times the eager-backend compile


def expected_cost(check: str, mode: str | None = None) -> float:
    """The expected cost of a case of ``check`` (``mode``: a compile case's backend mode)."""
    cost = next((c for prefix, c in _COSTS if check.startswith(prefix)), 1.0)
    return cost * (_INDUCTOR if mode == "inductor" else 1.0)


class Progress:
    """``total`` cases; ``weight``: their summed `expected_cost` (default: one each), so the
    bar fills as time passes rather than as cases are counted."""

    def __init__(
        self,
        total: int,
        *,
        stream: TextIO | None = None,
        enabled: bool = True,
        weight: float | None = None,
    ) -> None:
        self.total = max(total, 1)
        self.weight = max(weight if weight is not None else float(total), 1e-9)
        self.weight_done = 0.0
        self.done = 0
        self.red = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._last_decile = -1

    def update(self, case_id: str, status: str, cost: float = 1.0) -> None:
        self.done += 1
        self.weight_done += cost
        self.red += status in S.RED
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        frac = 1.0 if self.done == self.total else min(self.weight_done / self.weight, 1.0)
        if self.tty:
            width = 30
            filled = int(width * frac)
            bar = "#" * filled + "-" * (width - filled)
            label = case_id if len(case_id) <= 60 else case_id[:57] + "..."
            self.stream.write(
                f"\r[{bar}] {self.done}/{self.total} {elapsed:5.1f}s {self.red} red  {label:<60}"
            )
            if self.done == self.total:
                self.stream.write("\n")
        else:
            decile = int(frac * 10)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(
                    f"[{int(frac * 100):3d}%] {self.done}/{self.total} cases, "
                    f"{self.red} red, {elapsed:.1f}s\n"
                )
        self.stream.flush()
