"""A progress bar on stderr: redrawn in place on a terminal, a line per 10 % otherwise
(CI logs)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from opcore_conformance import status as S


class Progress:
    def __init__(self, total: int, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.red = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._last_decile = -1

    def update(self, case_id: str, status: str) -> None:
        self.done += 1
        self.red += status in S.RED
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        frac = self.done / self.total
        if self.tty:
            width = 30
            filled = int(width * frac)
            bar = "#" * filled + "-" * (width - filled)
            label = case_id if len(case_id) <= 60 else case_id[:57] + "..."
            self.stream.write(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.1f}s "
                              f"{self.red} red  {label:<60}")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            decile = int(frac * 10)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(f"[{int(frac * 100):3d}%] {self.done}/{self.total} cases, "
                                  f"{self.red} red, {elapsed:.1f}s\n")
        self.stream.flush()
