"""The op namespace: ``opcore.ir.ops.<name>`` is the registered `IrOp` of that name.

Every registered op is published here as a plain attribute (registering or removing an op
updates it), so ``ops.rms_norm`` costs one dict lookup; unknown names fall through to the
registry (PEP 562) for a clear error. The files of this package (leading underscore)
declare the built-in ops; an op cannot take one of their names.
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

for _name, _op in _all_ops().items():  # ops registered before this module finished importing
    globals().setdefault(_name, _op)
del _name, _op
