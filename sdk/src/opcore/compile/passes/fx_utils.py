"""FX graph helpers shared by the passes: which nodes are `opcore_ir` ops, node order,
storage aliasing, readable node descriptions.

Aliasing is decided from the fake tensors the tracers leave on each node
(``meta["val"]`` after AOTAutograd, ``meta["example_value"]`` in Dynamo's graph): two
nodes alias when their tensors share a storage. A node without a fake tensor is treated as
"unknown", and callers stay conservative about it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from opcore.ir import IrOp, all_ops


def ir_targets() -> tuple[dict[Any, IrOp], dict[Any, IrOp]]:
    """``(default overload -> op, maybe_inplace overload -> op)`` for every registered op."""
    default: dict[Any, IrOp] = {}
    inplace: dict[Any, IrOp] = {}
    for op in all_ops().values():
        if op.torch_op is not None:
            default[op.torch_op] = op
        if op.torch_op_inplace is not None:
            inplace[op.torch_op_inplace] = op
    return default, inplace


def fake_value(node: Any) -> Any:
    """The fake value a tracer recorded for ``node`` (``None`` when there is none)."""
    if not isinstance(node, fx.Node):
        return node
    if "val" in node.meta:
        return node.meta["val"]
    return node.meta.get("example_value")


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)


def storages(node: fx.Node) -> set[StorageWeakRef] | None:
    """Storages of the tensors ``node`` produces; ``None`` when it has no fake value."""
    value = fake_value(node)
    if value is None:
        return None
    out = set()
    for t in _tensors(value):
        try:
            out.add(StorageWeakRef(t.untyped_storage()))
        except (NotImplementedError, RuntimeError):  # sparse or exotic tensors
            return None
    return out


def aliases(graph: fx.Graph, node: fx.Node) -> list[fx.Node] | None:
    """Nodes whose tensors share a storage with ``node``'s (``node`` included), or
    ``None`` when aliasing cannot be decided (``node`` or a tensor-producing node has no
    fake value)."""
    mine = storages(node)
    if mine is None:
        return None
    if not mine:
        return [node]
    out = []
    for other in graph.nodes:
        if other.op == "output":
            continue
        theirs = storages(other)
        if theirs is None:
            if other.op in ("call_function", "call_method", "call_module") and other.users:
                return None
            continue
        if other is node or (theirs & mine):
            out.append(other)
    return out


def order(graph: fx.Graph) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def write_blocker(
    group: list[fx.Node],
    at: fx.Node,
    pos: dict[fx.Node, int],
    writable_inputs: set[fx.Node],
    input_reason: str,
    ignore: fx.Node | None = None,
) -> str | None:
    """Why the storage shared by ``group`` (one value and its aliases, see `aliases`) may
    not be overwritten at node ``at``, or ``None`` when it may: it is a graph input not in
    ``writable_inputs`` (``input_reason`` says why those are protected), a graph output, or
    read at or after ``at`` (``ignore`` is a user that does not count, e.g. the clone
    itself). The one rule behind in-place lowering and clone elimination."""
    for alias in group:
        if alias.op == "placeholder" and alias not in writable_inputs:
            return f"%{alias.name} is a graph input ({input_reason})"
        for user in alias.users:
            if user is at or user is ignore:
                continue
            if user.op == "output":
                return f"%{alias.name} is a graph output"
            if pos[user] >= pos[at]:
                return f"%{alias.name} is used at or after the in-place call (by %{user.name})"
    return None


def placeholders(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "placeholder"]


def describe(node: fx.Node) -> str:
    """``%name (target)`` plus the user-code line Dynamo recorded, when there is one."""
    target = node.target
    name = getattr(target, "__name__", None) or str(target)
    if hasattr(target, "_schema"):
        name = str(target)  # e.g. opcore_ir.rms_norm.default
    text = f"%{node.name} ({name})" if node.op == "call_function" else f"%{node.name} ({node.op})"
    trace = node.meta.get("stack_trace")
    if trace:
        lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
        if len(lines) >= 2:
            text += f" at {lines[-2]}: {lines[-1]}"
    return text


def bind_args(op: IrOp, node: fx.Node) -> list[Any]:
    """The node's arguments in the native function's parameter order, defaults filled in
    (lowering traces providers with positional arguments only)."""
    from opcore.ir.schema import signature

    bound = signature(op.native).bind(*node.args, **node.kwargs)
    bound.apply_defaults()
    return list(bound.args)


def known_equal(a: Any, b: Any) -> bool:
    """``a == b`` for ints or SymInts, without adding a guard (False when unknown)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(a == b))


def same_shape(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(known_equal(x, y) for x, y in zip(a, b, strict=True))


def single_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def getitem_users(node: fx.Node) -> dict[int, fx.Node] | None:
    """``{index: getitem node}`` when every user of ``node`` is ``operator.getitem`` with a
    distinct int index; else ``None``."""
    import operator

    out: dict[int, fx.Node] = {}
    for user in node.users:
        if (
            user.target is not operator.getitem
            or not isinstance(user.args[1], int)
            or user.args[1] in out
        ):
            return None
        out[user.args[1]] = user
    return out
