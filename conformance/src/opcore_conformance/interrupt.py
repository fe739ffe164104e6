"""SIGINT and SIGTERM during a command-line run: a clean stop, never a traceback.

Ctrl-C, `timeout` and a cancelled CI job send these. `Interruptions` is entered first
thing in ``opcore conformance`` (before torch is imported), so the whole run, setup and
collection included, is covered. While it is ``raising`` the handler raises `Interrupted`
where the main thread is; once the run turns to writing its reports it sets ``raising`` to
False, so a signal is only recorded, the reports are finished and then the run stops. Code
under test may catch and wrap the exception (torch.compile does), so callers also look at
`signal_name` after each step. Only the main thread can install handlers; elsewhere the
default behaviour stays.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

# What signal.signal accepts and returns (a handler, SIG_DFL / SIG_IGN, or None).
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """Raised by the handler. A `KeyboardInterrupt` (for SIGTERM too): code the run calls
    lets that pass (``except Exception`` does not take it, and opcore's plugin loading,
    which records anything else a plugin raises, passes it through)."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


def exit_status(signal_name: str) -> int:
    """The shell's convention: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(getattr(signal, signal_name))


class Interruptions:
    """Context manager installing the handlers; `signal_name` is the first signal received
    (None while none came)."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.raising = True
        self._previous: dict[int, _Handler] = {}

    def __enter__(self) -> Interruptions:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}

    def _handle(self, signum, _frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
        if self.raising:
            raise Interrupted(self.signal_name)

    def check(self) -> None:
        """Raise `Interrupted` when a signal came but its exception was swallowed."""
        if self.signal_name is not None and self.raising:
            raise Interrupted(self.signal_name)
