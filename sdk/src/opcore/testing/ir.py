"""Helpers for tests that register throw-away ops and providers.

Both context managers undo their registration on exit, so tests do not leak into each
other::

    from opcore.testing.ir import temporary_impl, temporary_op

    with temporary_impl(ops.rms_norm, "fake_fast", my_fn, supports_args=small_only):
        ...
    with temporary_op(my_native, name="test_scale") as op:
        ...

`unregister_op` removes an op by hand (compiled code that captured it keeps a dangling
reference, which is why it is here and not in `opcore.ir`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from opcore.ir import IrOp, register_op
from opcore.ir.registry import unregister_op

__all__ = ["temporary_impl", "temporary_op", "unregister_op"]


@contextlib.contextmanager
def temporary_impl(op: IrOp, provider: str, fn: Callable, **options: Any) -> Iterator[Callable]:
    """Register ``fn`` as ``provider`` of ``op`` (options as in `IrOp.register_impl`)
    inside the block."""
    op.register_impl(provider, **options)(fn)
    try:
        yield fn
    finally:
        op.unregister_impl(provider)


@contextlib.contextmanager
def temporary_op(fn: Callable, **options: Any) -> Iterator[IrOp]:
    """Register ``fn`` as an op (options as in `register_op`) inside the block; the
    ``opcore_ir`` torch op is removed afterwards."""
    op = register_op(**options)(fn)
    try:
        yield op
    finally:
        unregister_op(op.name)
