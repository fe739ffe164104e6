"""Scoped settings: ``with``-block values private to each thread and asyncio task.

`opcore.settings.set_current_config` and `IrOp.set_priority` are scopes: what a block sets is
seen by the code running inside it and by nothing else. All of them live on one stack in
one `contextvars.ContextVar`, so every thread starts with an empty stack and every asyncio
task starts with a copy of its creator's stack (the standard contextvars rules), and one
read (`current_scopes()`) tells a cache whether anything scoped may have changed here.

The stack is an immutable tuple of `Frame` (innermost last); every enter or exit makes a new
tuple, so its identity is a cheap cache key. A `ScopeKind` reads and pushes the frames of
one kind of setting.

Leaving is LIFO-safe: a block removes its own frame, whatever the order in which blocks
exit. When it is the innermost frame of the current stack (the usual case) the ContextVar
token restores the exact previous stack object, so caches keyed on the stack's identity hit
again; otherwise the frame is cut out of the current stack and the frames of blocks still
open stay in force, in their order.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

_STACK: contextvars.ContextVar[tuple[Frame, ...]] = contextvars.ContextVar(
    "opcore_scopes", default=()
)

# The open blocks of this thread or task, innermost last (``()`` when none is open). The
# ContextVar's bound ``get``: the cheapest call there is, for dispatch hot paths.
current_scopes = _STACK.get


class Frame:
    """One open block: the ``kind`` of setting and its ``value``. Frames are compared by
    identity (two blocks that set equal values are still two frames)."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: Any):
        self.kind = kind
        self.value = value

    def __repr__(self) -> str:
        return f"Frame({self.kind!r}, {self.value!r})"


class ScopeKind:
    """The blocks of one kind of setting (``name``) on the shared stack."""

    def __init__(self, name: str):
        self.name = name

    def top(self, frames: tuple[Frame, ...] | None = None) -> Any:
        """The innermost open block's value (in ``frames``, default the current stack), or
        ``None`` when no block of this kind is open."""
        for frame in reversed(_STACK.get() if frames is None else frames):
            if frame.kind == self.name:
                return frame.value
        return None

    def values(self, frames: tuple[Frame, ...] | None = None) -> list[Any]:
        """The values of the open blocks of this kind, outermost first."""
        return [
            f.value for f in (_STACK.get() if frames is None else frames) if f.kind == self.name
        ]

    @contextlib.contextmanager
    def push(self, value: Any) -> Iterator[Frame]:
        """Open a block whose value is ``value``; leaving removes exactly this block."""
        frame, mine, token = self.enter(value)
        try:
            yield frame
        finally:
            _leave(frame, mine, token)

    def enter(self, value: Any) -> tuple[Frame, tuple[Frame, ...], contextvars.Token]:
        """Open a block whose value is ``value``; returns what `leave` takes. For context
        managers written as classes (cheaper to enter and leave than `push`'s generator)."""
        frame = Frame(self.name, value)
        mine = (*_STACK.get(), frame)
        return frame, mine, _STACK.set(mine)

    @staticmethod
    def leave(frame: Frame, mine: tuple[Frame, ...], token: contextvars.Token) -> None:
        """Close the block `enter` opened: removes exactly this block."""
        _leave(frame, mine, token)


def _leave(frame: Frame, mine: tuple[Frame, ...], token: contextvars.Token) -> None:
    current = _STACK.get()
    if current is mine:
        try:
            _STACK.reset(token)
            return
        except ValueError:  # the block is left in another Context than it was entered in
            pass
    if any(f is frame for f in current):
        # Blocks left out of order: drop this one only; the others stay in force.
        _STACK.set(tuple(f for f in current if f is not frame))
    # else: this context never saw the block (it began in another context): nothing to undo
