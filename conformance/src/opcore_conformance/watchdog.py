"""A time bound on every conformance case, and a way out of a run stuck where Python cannot
reach.

One thread per run, not per case. A case costs a slot object and two attribute writes
(`Watchdog.call` puts the case and its start time in ``_current`` and clears it); the thread
sleeps until the current slot's deadline and looks again, so while cases are short it wakes
about once per bound, and nothing is sent to it per case.

Past the bound the thread sends `TIMEOUT_SIGNAL` to the main thread with ``pthread_kill``:
a blocking call there (``time.sleep``, ``Lock.acquire``, ``select``) returns EINTR, and the
handler raises `CaseTimedOut` inside the case; `call` returns "timed out" and the run goes on
with the next case. A case that swallows it gets it again every `REFIRE_S`: Python prints and
drops what a weakref callback or a finalizer raises, and a thread deadlocked in one (the
virtual device's defect in issue 27) is interrupted there each time. So from the second
signal on, the handler also arms the frames that called the one it interrupts (`_arm_callers`):
the next line any of them runs raises `CaseTimedOut` again, outside the callback.

A case still running ``grace_s`` after its bound waits where no exception reaches: a C call
that never returns and holds no GIL (a driver wait, a native lock). That thread cannot be
freed, so the run cannot go on in this process: the watchdog takes over on its own thread,
``takeover("case", slot)`` records the case and writes the reports, marked incomplete, and
the process exits with the status it returns.

Signals (``signals``): Python runs signal handlers in the main thread only, between
bytecodes, so a SIGTERM to a main thread in such a call would wait forever. Python's wakeup
fd (written by the C-level handler, on whichever thread the signal lands) tells this thread
that one came; if the main thread has not begun writing the reports ``signal_grace_s`` later,
the watchdog takes over the same way: ``takeover("signal", name)``.

Not covered: a C call that holds the GIL forever stops this thread too; only a kill from
outside ends that process (its JSONL then holds every finished case, without a footer).
Without ``pthread_kill`` (not POSIX) or off the main thread there is no bound. A case that
installs its own SIGALRM handler, or its own wakeup fd (asyncio does), takes those for
itself: its bound then ends as a stuck case, and a signal reaches only a thread in Python.
"""

from __future__ import annotations

import math
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

# Ten minutes: about six times the slowest legitimate case measured (a run's first Inductor
# compile, 103 s on a busy 2-core CPU), and a hang is cut long before the hour a CI job
# typically allows. docs/conformance.md#a-time-bound-per-case.
DEFAULT_CASE_TIMEOUT_S = 600.0
TIMEOUT_SIGNAL: int | None = getattr(signal, "SIGALRM", None)
REFIRE_S = 0.5  # how often a case that swallowed CaseTimedOut gets it again
SIGNAL_GRACE_S = 2.0  # how long a signalled main thread has to start writing the reports
_LOCK_WAIT_S = 10.0  # the watchdog's wait for a main thread that is writing a record
# The bound on a takeover's own writing: the header it may still have to build asks the
# platform for its device name, which a plugin stuck in its device could block too.
_TAKEOVER_LIMIT_S = 30.0
_STOP = 0  # the byte `__exit__` sends (no signal has number 0)
# The footer's "interrupted" for a run ended by a case stuck past its bound.
CASE_TIMEOUT = "case timeout"

Takeover = Callable[[str, Any], int]


def parse_bound(value: Any, flag: str) -> float:
    """``value`` (text or number) as seconds: finite and > 0, else a `ValueError` naming
    ``flag``."""
    try:
        bound = float(value)
    except (TypeError, ValueError):
        bound = math.nan
    if isinstance(value, bool) or not (math.isfinite(bound) and bound > 0):
        raise ValueError(f"{flag} {value}: expected a number of seconds, finite and > 0")
    return bound


def timeout_message(bound_s: float, elapsed_s: float, *, stuck: bool) -> str:
    head = f"ran past its time bound of {bound_s:g} s (--case-timeout)"
    if not stuck:
        return f"{head}: stopped after {elapsed_s:.1f} s; the run went on with the next case"
    return (
        f"{head} and was still running {elapsed_s:.1f} s after it started: no exception "
        f"stops it (a native call that never returns, or code that swallows every one); "
        f"the run ended here, the cases after it did not run"
    )


class CaseTimedOut(BaseException):
    """Raised in the main thread inside a case past its bound. Not an `Exception`, so a
    body's ``except Exception`` does not take it."""


class _Slot:
    __slots__ = ("case", "start", "fired", "sent", "raised", "trace")

    def __init__(self, case: Any, start: float) -> None:
        self.case = case
        self.start = start
        self.fired: float | None = None  # when the main thread was first signalled
        self.sent = 0.0  # when it was last signalled
        self.raised = 0  # how many CaseTimedOut the handler raised in this case
        self.trace: Any = None  # the thread's trace function before `_arm_callers`


class Watchdog:
    """Context manager (enter it in the main thread): the bound for `call`, and the takeover
    of a stuck run. ``lock`` / ``taken`` / ``finishing``: whoever writes reports holds
    ``lock``; the main thread writes nothing once ``taken``, the watchdog takes nothing
    over once ``finishing`` (`write`, `start_finishing`)."""

    def __init__(
        self,
        bound_s: float,
        *,
        takeover: Takeover,
        signals: Iterable[int] = (),
        grace_s: float | None = None,
        signal_grace_s: float = SIGNAL_GRACE_S,
    ) -> None:
        self.bound_s = bound_s
        # Up to 5 s more for the case to unwind (a slow `finally`) before it counts as stuck.
        self.grace_s = min(5.0, bound_s) if grace_s is None else grace_s
        self.signal_grace_s = signal_grace_s
        # Below the bound, so a refire wait for one case never oversleeps the next one's.
        self._refire_s = min(REFIRE_S, bound_s)
        self.lock = threading.Lock()
        self.taken = False
        self.finishing = False
        self._takeover = takeover
        self._signals = frozenset(int(s) for s in signals)
        self._signalled: tuple[str, float] | None = None
        self._current: _Slot | None = None
        self._thread: threading.Thread | None = None
        self._main = 0
        self._signum = 0
        self._socks: tuple[socket.socket, socket.socket] | None = None
        self._previous: Any = None
        self._previous_wakeup = -1

    # ------------------------------------------------------------------ main thread
    def __enter__(self) -> Watchdog:
        if TIMEOUT_SIGNAL is None or threading.current_thread() is not threading.main_thread():
            return self  # no bound: handlers and pthread_kill need the main thread
        self._signum = TIMEOUT_SIGNAL
        self._main = threading.get_ident()
        self._socks = socket.socketpair()
        for s in self._socks:
            s.setblocking(False)
        self._previous = signal.signal(self._signum, self._on_timeout_signal)
        if self._signals:
            self._previous_wakeup = signal.set_wakeup_fd(
                self._socks[1].fileno(), warn_on_full_buffer=False
            )
        self._thread = threading.Thread(
            target=self._loop, name="opcore-conformance-watchdog", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is None or self._socks is None:
            return
        try:
            self._socks[1].send(bytes([_STOP]))
        except OSError:
            pass
        self._thread.join(timeout=5)
        if self._signals:
            signal.set_wakeup_fd(self._previous_wakeup)
        signal.signal(self._signum, self._previous)
        for s in self._socks:
            s.close()
        self._thread, self._socks = None, None

    def call(self, case: Any, fn: Callable[..., Any], *args: Any) -> tuple[Any, float | None]:
        """``fn(*args)`` as the body of ``case``, under the bound: ``(value, None)``, or
        ``(None, seconds it ran)`` when it ran past the bound (its value is dropped: a body
        may have wrapped `CaseTimedOut` in an error of its own)."""
        if self._thread is None:
            return fn(*args), None
        slot = self._current = _Slot(case, time.monotonic())
        try:
            value = _body(fn, args)
        except CaseTimedOut:
            value = None
        finally:
            self._current = None
            if slot.raised >= 2:
                sys.settrace(slot.trace)  # ours is off by now, or goes now
        if slot.fired is None:
            return value, None
        return None, time.monotonic() - slot.start

    def write(self, fn: Callable[..., Any], *args: Any) -> bool:
        """``fn(*args)`` (a report write) unless the watchdog has taken over: then False,
        after waiting (bounded) for its thread, which ends the process."""
        with self.lock:
            if not self.taken:
                fn(*args)
                return True
        self._wait_for_takeover()
        return False

    def start_finishing(self) -> bool:
        """The main thread is about to write the reports: True, and the watchdog takes
        nothing over from now on; False when it already has (see `write`)."""
        with self.lock:
            if not self.taken:
                self.finishing = True
                self._current = None  # left set if a signal's exception cut `call` short
                return True
        self._wait_for_takeover()
        return False

    def _wait_for_takeover(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=60)  # its takeover ends the process well before

    def _on_timeout_signal(self, _signum: int, frame: Any) -> None:
        slot = self._current
        # Raise only inside the case: `call`'s own frame is harness code (after the body
        # returned, or in its except/finally), where the exception would escape it. The
        # body runs in `_body`'s frame at least, even when ``fn`` is a C function.
        if slot is None or slot.fired is None or frame is None or frame.f_code is _CALL_CODE:
            return
        slot.raised += 1
        if slot.raised == 2:
            # The first one was swallowed (not armed at the first: a body unwinding from
            # it, its `finally` blocks, must not be interrupted again at once).
            slot.trace = sys.gettrace()
            _arm_callers(frame)
        raise CaseTimedOut(slot.case)

    # ------------------------------------------------------------------ watchdog thread
    def _loop(self) -> None:
        assert self._socks is not None
        reader = self._socks[0]
        while True:
            wait = self._check(time.monotonic())
            if wait is None:
                return  # taken over (or the main thread is finishing after a signal)
            ready, _, _ = select.select([reader], [], [], max(wait, 0.0))
            if not ready:
                continue
            try:
                data = reader.recv(256)
            except BlockingIOError:
                continue
            if not data or _STOP in data:
                return
            for number in data:
                if number in self._signals and self._signalled is None:
                    self._signalled = (signal.Signals(number).name, time.monotonic())
                    # Wake a main thread whose wait the signal did not interrupt (it landed
                    # on another thread): the pending handler then runs there.
                    self._signal_main()

    def _check(self, now: float) -> float | None:
        """Act on the state at ``now``; the seconds until the next look (None: stop)."""
        until_signal = None
        if self._signalled is not None:
            name, at = self._signalled
            until_signal = at + self.signal_grace_s - now
            if until_signal <= 0:
                self._take_over("signal", name)
                return None
        slot = self._current
        if slot is None:
            wait = self.bound_s  # a case starting meanwhile ends no earlier than that
        elif slot.fired is None:
            wait = slot.start + self.bound_s - now
            if wait <= 0:
                slot.fired = slot.sent = now
                self._signal_main()
                wait = self._refire_s
        elif now - slot.fired >= self.grace_s:
            self._take_over("case", slot)
            return None
        else:
            # By the clock, not per wake-up: each signal sent wakes this thread too (its
            # byte on the wakeup fd).
            if now - slot.sent >= self._refire_s:
                slot.sent = now
                self._signal_main()
            wait = min(slot.sent + self._refire_s, slot.fired + self.grace_s) - now
        return wait if until_signal is None else min(wait, until_signal)

    def _signal_main(self) -> None:
        try:
            signal.pthread_kill(self._main, self._signum)
        except (OSError, ValueError):  # the main thread is gone: the process is ending
            pass

    def _take_over(self, kind: str, what: Any) -> None:
        if not self.lock.acquire(timeout=_LOCK_WAIT_S):
            _say(f"the run is stuck ({kind}) while writing a record; no footer written")
            os._exit(1)
        try:
            if self.finishing:
                return  # the main thread got there first and writes the reports
            self.taken = True
        finally:
            self.lock.release()
        last_resort = threading.Timer(_TAKEOVER_LIMIT_S, _give_up, (kind,))
        last_resort.daemon = True
        last_resort.start()
        status = 1
        try:
            status = self._takeover(kind, what)
        except BaseException as exc:  # noqa: BLE001  (the process ends either way)
            _say(f"writing the reports of a stuck run failed: {type(exc).__name__}: {exc}")
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass
            # The main thread cannot be joined or unwound: end the process from here.
            os._exit(status)


def _body(fn: Callable[..., Any], args: tuple) -> Any:
    return fn(*args)


def _arm_callers(frame: Any) -> None:
    """Make every caller of ``frame`` up to `Watchdog.call` raise `CaseTimedOut` at its next
    line. A trace function that raises is removed by Python, and its exception propagates in
    the frame it traced (how a debugger's frames get their events, but raising)."""
    caller = frame.f_back
    while caller is not None and caller.f_code is not _CALL_CODE:
        caller.f_trace = _raise_timed_out
        caller = caller.f_back
    sys.settrace(_trace_nothing)  # tracing on; frames called from now on are not traced


def _raise_timed_out(_frame: Any, _event: str, _arg: Any) -> Any:
    raise CaseTimedOut("raised again in a caller of the frame that swallowed it")


def _trace_nothing(_frame: Any, _event: str, _arg: Any) -> None:
    return None


def _give_up(kind: str) -> None:
    _say(f"writing the reports of a stuck run ({kind}) took over {_TAKEOVER_LIMIT_S:g} s; gave up")
    os._exit(1)


def _say(text: str) -> None:
    print(f"opcore conformance: {text}", file=sys.stderr, flush=True)


_CALL_CODE = Watchdog.call.__code__
