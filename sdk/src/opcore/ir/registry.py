"""The registered ops by name: the one table `register_op` fills and `get_op` reads."""

from __future__ import annotations

import threading
from typing import Any

# name -> `opcore.ir.op.IrOp`
OPS: dict[str, Any] = {}
lock = threading.RLock()


def op_names() -> list[str]:
    """The registered ops' names, sorted (collective ones included)."""
    return sorted(OPS)
