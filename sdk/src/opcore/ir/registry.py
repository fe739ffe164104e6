"""The registered ops by name: the one table `register_op` fills and `get_op` reads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# name -> `opcore.ir.op.IrOp`
OPS: dict[str, Any] = {}
lock = threading.RLock()
# Called, under ``lock``, with each op `unregister_op` removes: `opcore.ir.op` drops the
# op's torch.library registration and the dispatch routes built on the old table.
_on_unregister: list[Callable[[Any], None]] = []


def op_names() -> list[str]:
    """The registered ops' names, sorted (collective ones included)."""
    return sorted(OPS)


def on_unregister(callback: Callable[[Any], None]) -> None:
    """Call ``callback(op)`` for each op `unregister_op` removes."""
    _on_unregister.append(callback)


def unregister_op(name: str) -> None:
    """Remove an op and its torch registration. For tests (`opcore.testing.ir`), not part
    of the public API: compiled code that captured the op keeps a dangling reference."""
    with lock:
        op = OPS.pop(name, None)
        if op is None:
            raise KeyError(f"no op named {name!r}")
        for callback in _on_unregister:
            callback(op)
