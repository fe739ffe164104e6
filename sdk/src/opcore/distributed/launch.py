"""`run_ranks`: run a function on N local processes joined in one process group.

For tests, the conformance suite and benchmarks on one machine. The parent picks a TCP
port free on 127.0.0.1, where the ranks meet (``tcp://127.0.0.1:<port>``: no other address
is named), starts the ranks with ``torch.multiprocessing`` (spawn), and collects one
outcome per rank. The backend's own transport picks its interface as the backend does
(its environment variables pin it, e.g. to the loopback interface). Every wait is
bounded: each rank's rendezvous and collectives by ``comm_timeout_s``, the whole run by
``timeout_s``. A rank that raises, dies or runs out of time never hangs the parent: the
others are given ``grace_s`` to finish, then terminated, then killed, and each rank's
outcome says what happened to it. A rank is ``"ok"`` only when its process also ended
without a signal or exit code from anywhere but the launcher.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import pickle
import queue as queue_module
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


@dataclasses.dataclass
class RankOutcome:
    """What one rank did.

    Attributes:
        rank: the rank.
        status: ``"ok"`` (``fn`` returned ``value`` and the process then exited with
            code 0, or was still tearing down ``grace_s`` after the run and the launcher
            terminated it: ``error`` says so), ``"error"`` (``fn`` or the setup raised;
            ``error`` holds its message and ``traceback`` the stack), ``"died"`` (the
            process ended without a report, or after reporting ended by a signal or a
            non-zero exit code the launcher did not cause, a SIGTERM from elsewhere say:
            ``exitcode``; ``value`` holds what it reported, if anything), or ``"timeout"``
            (still running when the run's time was up; it was terminated).
        value: what ``fn`` returned (``status == "ok"``, or ``"died"`` after reporting).
        error: one line: the exception's type and message, or what happened.
        traceback: the formatted stack of an ``"error"``.
        exitcode: the process's exit code (negative: the signal that ended it).
        elapsed_s: seconds from the start of the run to the rank's report or end.
    """

    rank: int
    status: str
    value: Any = None
    error: str = ""
    traceback: str = ""
    exitcode: int | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class RanksFailed(RuntimeError):
    """Raised by `check`: some rank did not return; the message names each one."""

    def __init__(self, outcomes: list[RankOutcome]):
        self.outcomes = outcomes
        bad = [o for o in outcomes if not o.ok]
        lines = [f"{len(bad)} of {len(outcomes)} ranks failed:"]
        for o in bad:
            lines.append(f"  rank {o.rank}: {o.status} after {o.elapsed_s:.1f} s: {o.error}")
        first = next((o for o in bad if o.traceback), None)
        if first is not None:
            lines.append(f"rank {first.rank}'s traceback:\n{first.traceback.rstrip()}")
        super().__init__("\n".join(lines))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _exit_with_parent(poll_s: float = 1.0) -> None:
    """End this rank when its parent is gone (killed before it could stop the ranks), so
    no rank outlives the run holding a device or a port."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:  # re-parented: the launcher died
                os._exit(1)

    threading.Thread(target=watch, name="opcore-rank-parent-watch", daemon=True).start()


@dataclasses.dataclass(frozen=True)
class _FunctionRef:
    """Where a rank finds ``fn``: its module's name and file, and its qualified name.

    A spawned process unpickles a function by importing its module by name, which fails
    for a module that was loaded from a file and not through ``sys.path`` (pytest's
    ``--import-mode=importlib`` loads test modules so). The rank imports the module by
    name when it can, else loads it from the file under the same name."""

    module: str
    file: str | None
    qualname: str

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> _FunctionRef | Callable[..., Any]:
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", "")
        if not module or "<locals>" in qualname or "<lambda>" in qualname:
            raise ValueError(
                f"run_ranks: fn must be a module-level function (each rank imports it), "
                f"got {qualname or fn!r}"
            )
        if module == "__main__":
            return fn  # spawn re-runs the main script as __mp_main__ and finds it there
        file = getattr(sys.modules.get(module), "__file__", None)
        return cls(module, file, qualname)

    def resolve(self) -> Callable[..., Any]:
        try:
            mod = importlib.import_module(self.module)
        except ImportError:
            if self.file is None:
                raise
            spec = importlib.util.spec_from_file_location(self.module, self.file)
            if spec is None or spec.loader is None:
                raise
            mod = importlib.util.module_from_spec(spec)
            sys.modules[self.module] = mod
            spec.loader.exec_module(mod)
        obj: Any = mod
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    fn: _FunctionRef | Callable[..., Any],
    args: tuple,
    results: Any,
    comm_timeout_s: float,
    env: dict[str, str],
    threads: int,
) -> None:
    os.environ.update(env)
    start = time.monotonic()
    _exit_with_parent()
    teardown: Callable[[], None] | None = None
    try:
        import torch

        torch.set_num_threads(threads)
        from opcore.distributed.groups import init_distributed, shutdown

        teardown = shutdown

        comm = init_distributed(
            rank,
            world_size,
            init_method=f"tcp://127.0.0.1:{port}",
            timeout_s=comm_timeout_s,
        )
        target = fn.resolve() if isinstance(fn, _FunctionRef) else fn
        value = target(comm, *args)
        # Reported before the teardown, which can block when a peer is gone: the parent
        # has the result either way. Pickled here so no tensor travels through shared
        # memory that dies with this process.
        results.put((rank, "ok", pickle.dumps(value), "", "", time.monotonic() - start))
    except BaseException as exc:  # everything is reported; the parent decides
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()
        results.put(
            (
                rank,
                "error",
                b"",
                text[0] if text else type(exc).__name__,
                traceback.format_exc(),
                time.monotonic() - start,
            )
        )
    finally:
        if teardown is not None:
            try:
                teardown()
            except Exception:  # a group broken by a dead peer may not tear down cleanly
                pass


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: tuple = (),
    timeout_s: float = 120.0,
    comm_timeout_s: float = 30.0,
    grace_s: float = 5.0,
    env: dict[str, str] | None = None,
    threads: int | None = None,
) -> list[RankOutcome]:
    """Run ``fn(comm, *args)`` on ranks ``0..world_size-1``, one process each.

    Each rank imports opcore, calls `opcore.distributed.init_distributed` (the current
    platform's backend and device ``rank % device_count``), runs ``fn`` with the
    ``"world"`` communicator, and tears the group down. ``fn`` and ``args`` must be
    picklable (``fn`` a module-level function); what ``fn`` returns is pickled back.

    Args:
        fn: the function each rank runs.
        world_size: number of ranks (>= 1).
        args: extra arguments for ``fn``.
        timeout_s: bound on the whole run, start-up included.
        comm_timeout_s: the process group's and communicator's timeout in each rank.
        grace_s: after the first rank fails, how long the others may still take to
            report before they are terminated; and after the last report, how long the
            ranks that reported may take to exit (tear down) before they are.
        env: variables set in each rank before opcore is imported (``OPCORE_PLATFORM``).
        threads: torch threads per rank (default: the CPU count split among the ranks).

    Returns:
        One `RankOutcome` per rank, in rank order.

    Raises:
        ValueError: a bad argument, named, before any rank starts: ``world_size`` not an
            int >= 1, ``timeout_s`` or ``comm_timeout_s`` not a finite number > 0,
            ``grace_s`` not a finite number >= 0, ``fn`` not a module-level function.
    """
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    for name, value, least in (
        ("timeout_s", timeout_s, "> 0"),
        ("comm_timeout_s", comm_timeout_s, "> 0"),
        ("grace_s", grace_s, ">= 0"),
    ):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and (value >= 0 if least == ">= 0" else value > 0)):
            raise ValueError(f"run_ranks: {name} must be a finite number {least}, got {value!r}")
    ref = _FunctionRef.of(fn)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size)
    start = time.monotonic()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(r, world_size, port, ref, args, results, comm_timeout_s, env or {}, threads),
            name=f"opcore-rank-{r}",
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    outcomes: dict[int, RankOutcome] = {}
    deadline = start + timeout_s
    first_failure: float | None = None
    try:
        while len(outcomes) < world_size:
            now = time.monotonic()
            if now >= deadline:
                break
            if first_failure is not None and now >= first_failure + grace_s:
                break
            try:
                rank, status, blob, error, tb, elapsed = results.get(
                    timeout=min(0.2, max(0.01, deadline - now))
                )
            except queue_module.Empty:
                for r, p in enumerate(procs):
                    if r not in outcomes and p.exitcode is not None and not _pending(results):
                        outcomes[r] = RankOutcome(
                            r,
                            "died",
                            error=f"the process ended ({_ending(p.exitcode)}) without a report",
                            exitcode=p.exitcode,
                            elapsed_s=time.monotonic() - start,
                        )
                        first_failure = first_failure or time.monotonic()
                continue
            returned = pickle.loads(blob) if status == "ok" else None
            outcomes[rank] = RankOutcome(rank, status, returned, error, tb, None, elapsed)
            if status != "ok" and first_failure is None:
                first_failure = time.monotonic()
    finally:
        stopped = _stop(procs, outcomes, grace_s)
    for r, p in enumerate(procs):
        if r in outcomes:
            o = outcomes[r]
            o.exitcode = p.exitcode
            if o.status != "ok" or p.exitcode == 0:
                continue
            if r in stopped:  # reported, then still tearing down: the launcher ended it
                o.error = (
                    f"returned; still tearing down {grace_s:g} s after the run, "
                    f"terminated by run_ranks ({_ending(p.exitcode)})"
                )
            else:  # reported, then ended by something else: not a clean run
                o.status = "died"
                o.error = f"returned, then the process ended ({_ending(p.exitcode)})"
        else:
            budget = "its grace period" if first_failure is not None else f"{timeout_s:g} s"
            outcomes[r] = RankOutcome(
                r,
                "timeout",
                error=f"no report within {budget}; terminated",
                exitcode=p.exitcode,
                elapsed_s=time.monotonic() - start,
            )
    results.close()
    return [outcomes[r] for r in range(world_size)]


def _pending(results: Any) -> bool:
    try:
        return not results.empty()
    except (OSError, ValueError):
        return False


def _ending(exitcode: int | None) -> str:
    """``exit code 3``, or ``SIGTERM, exit code -15`` for a process a signal ended."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"{signal.Signals(-exitcode).name}, exit code {exitcode}"
        except ValueError:
            pass
    return f"exit code {exitcode}"


def _stop(procs: list[Any], reported: dict[int, RankOutcome], exit_s: float) -> set[int]:
    """Terminate, then kill, every rank still running; join each (bounded). The ranks that
    reported get ``exit_s`` in all to exit on their own (an interpreter with torch loaded
    takes about a second to end), the others 0.5 s each. Returns the ranks this
    terminated or killed."""
    deadline = time.monotonic() + exit_s
    for r, p in enumerate(procs):
        if p.exitcode is None:
            wait = deadline - time.monotonic() if r in reported else 0.5
            p.join(timeout=max(0.0, wait))
    stopped = set()
    for r, p in enumerate(procs):
        if p.exitcode is None:
            p.terminate()
            stopped.add(r)
    for p in procs:
        p.join(timeout=3.0)
        if p.exitcode is None:
            p.kill()
            p.join(timeout=3.0)
    return stopped


def check(outcomes: list[RankOutcome]) -> list[Any]:
    """The ranks' values, in rank order; `RanksFailed` naming each failed rank
    otherwise."""
    if all(o.ok for o in outcomes):
        return [o.value for o in outcomes]
    raise RanksFailed(outcomes)
