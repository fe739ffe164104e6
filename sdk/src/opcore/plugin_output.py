"""Plugin code writes to stderr, never to the application's stdout.

opcore runs plugin code at times the application does not choose (an entry point's import,
a probe, a platform's ``__init__``, a general plugin), and a ``print`` there would corrupt
output that tools parse, such as ``opcore info --json``. `plugin_output_to_stderr` routes
``sys.stdout`` writes made *by the calling thread* to ``sys.stderr`` while plugin code runs.

Other threads are not affected: while any thread runs plugin code, ``sys.stdout`` is a small
router that looks up, per write, whether the writing thread is inside plugin code. The
router is removed when the last such thread leaves (a probe abandoned after its time budget
keeps it installed for as long as it runs, so its late output still goes to stderr). Only
Python-level writes are routed; a native library writing to file descriptor 1 is not.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

_local = threading.local()  # .depth: how deep this thread is inside plugin code
_lock = threading.Lock()
_users = 0  # threads (counted per entry) inside plugin code right now
_router: _StdoutRouter | None = None


def _in_plugin_code() -> bool:
    return getattr(_local, "depth", 0) > 0


class _StdoutRouter:
    """Stands in for ``sys.stdout``: plugin threads write to ``sys.stderr``, others to
    the stream that was ``sys.stdout`` when the router was installed."""

    def __init__(self, stdout: Any) -> None:
        self.stdout = stdout

    def _target(self) -> Any:
        if _in_plugin_code():
            return sys.stderr
        return self.stdout

    def write(self, text: str) -> int:
        target = self._target()
        if target is None:  # no stderr (pythonw): the text goes nowhere, as it would there
            return len(text)
        return target.write(text)

    def flush(self) -> None:
        target = self._target()
        if target is not None:
            target.flush()

    def __getattr__(self, name: str) -> Any:
        # encoding, isatty, fileno, ...: answered by the stream this thread writes to.
        return getattr(self._target(), name)


@contextlib.contextmanager
def plugin_output_to_stderr() -> Iterator[None]:
    """While the block runs, this thread's ``print`` / ``sys.stdout.write`` go to stderr.

    Re-entrant and thread-safe. If the application replaces ``sys.stdout`` meanwhile, its
    replacement is left in place when the block ends.
    """
    global _users, _router
    with _lock:
        if _users == 0 and sys.stdout is not None:
            _router = _StdoutRouter(sys.stdout)
            sys.stdout = _router
        _users += 1
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
        with _lock:
            _users -= 1
            if _users == 0 and _router is not None:
                if sys.stdout is _router:
                    sys.stdout = _router.stdout
                _router = None
