"""The op namespace: ``opcore.ir.ops.<name>`` is the registered `IrOp` of that name.

Attribute lookup falls through to the registry (PEP 562), so ops registered later by
plugins appear here too. The files of this package (leading underscore) declare the
built-in ops.
"""

from __future__ import annotations

from opcore.ir.op import all_ops as _all_ops
from opcore.ir.op import get_op as _get_op


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _get_op(name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_all_ops()))


from opcore.ir.ops import _activation, _norm, _qkv, _rotary  # noqa: E402,F401  (register the built-in ops)
