"""Fusion: an RMSNorm or gated activation followed by an FP8 quantization becomes one op.

Each pass matches, on the functional graph after AOTAutograd (and after `fuse_add_rms_norm`,
so a residual add + ``rms_norm`` arrives as ``fused_add_rms_norm``), a producer whose
output is read by exactly one quantization, and rewrites the pair to the fused op:

============================================  ===========================================
pattern (unfused, as a user writes it)        rewritten to
============================================  ===========================================
``y = rms_norm(x, w, eps)``                   ``q = rms_norm_static_fp8_quant(x, w, eps, s)``
``q = scaled_fp8_quant(y, s)``
``y, r = fused_add_rms_norm(x, res, w, eps)``   ``q, r = fused_add_rms_norm_static_fp8_quant(
``q = scaled_fp8_quant(y, s)``                 x, res, w, eps, s)``
``y = rms_norm(x, w, eps)`` or                ``q, sc, r = rms_norm_dynamic_per_token_quant(
``y, r = fused_add_rms_norm(x, res, w, eps)``  x, w, eps, res or None, ub)``
``q, sc = dynamic_per_token_scaled_fp8_quant(
y, ub)``
``y = silu_and_mul(x)``                       ``q = silu_and_mul_fp8_quant(x, s)``
``q = scaled_fp8_quant(y, s)``
``y = silu_and_mul(x)``                       ``q, sc = silu_and_mul_per_token_group_fp8_quant(
``q, sc = per_token_group_quant_fp8(y, g)``    x, g)``
============================================  ===========================================

The quantized outputs may go anywhere (typically ``aten._scaled_mm``, which reads ``q``
and the scales unchanged). A pair whose shape matches but cannot be fused is left alone
and the reason is noted in the compile record (`CompileRecord.fusion_misses`):

- the intermediate ``y`` has another user than the quantization (it escapes: the fused op
  never materializes it);
- an argument the fused op has no parameter for is not its default (``variance_size`` set,
  ``column_major_scales=True``);
- the fused op is not registered, its validator refuses the arguments (their fake tensors),
  or no provider takes them under the compile's config: a fusion never creates a node
  lowering could not run. ``native`` is a provider, so where the fused op's native function
  takes the arguments it is usable; which provider runs is lowering's choice, in the
  record as for every op;
- the fused op's outputs (its fake implementation) differ in shape or dtype from the values
  they would replace (e.g. a platform whose quantizations disagree on the fp8 dtype);
- no place in the graph comes after all the fused op's inputs and before every use of what
  it replaces.

Numerics: the norm + quant ops and ``silu_and_mul_per_token_group_fp8_quant`` are defined
as their unfused chain (the intermediate rounded to the input dtype, then quantized), so
those rewrites keep the result: bit for bit with ``native``, within the fused op's fp8
tolerance (`opcore.ir.tolerances.fp8_tolerance`) with a kernel. ``silu_and_mul_fp8_quant``
rounds once (``silu(gate) * up`` quantized from fp32), so ``fuse_silu_and_mul_fp8_quant``
changes the result by the chain's rounding of the intermediate: at most one e4m3 code on a
small fraction of elements (`opcore.ir.tolerances.fp8_chain_tolerance`) while that
intermediate is a normal number of the input dtype; where it is not (fp16 below 6.1e-5) the
fused result is the closer one to the exact value, by more.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from opcore.compile import record as _record
from opcore.compile.passes import fx_utils
from opcore.ir import IrOp, all_ops

# (fused args, None) when the pair can be fused, else (None, reason). Arguments: the
# producer's and the quantization's bound arguments (parameter order, defaults filled in).
ArgBuilder = Callable[[list[Any], list[Any]], tuple[tuple[Any, ...] | None, str | None]]


@dataclasses.dataclass(frozen=True)
class QuantFusion:
    """One producer -> quantization pattern. ``outputs[i]`` says which value the fused
    op's output ``i`` replaces: ``("quant", k)`` / ``("producer", k)`` is output ``k`` of
    that node (``k=None``: the node itself, a single-tensor op), ``None`` replaces
    nothing (an output the unfused graph did not have)."""

    name: str
    producer: str
    quant: str
    fused: str
    args: ArgBuilder
    outputs: tuple[tuple[str, int | None] | None, ...]
    producer_output: int | None  # which producer output the quantization reads


def _rms_static(p: list[Any], q: list[Any]):
    x, weight, eps, variance_size = p
    if variance_size is not None:
        return None, "rms_norm has variance_size set; the fused op normalizes the whole row"
    return (x, weight, eps, q[1]), None


def _add_rms_static(p: list[Any], q: list[Any]):
    x, residual, weight, eps, variance_size = p
    if variance_size is not None:
        return None, "fused_add_rms_norm has variance_size set; the fused op has none"
    return (x, residual, weight, eps, q[1]), None


def _rms_dynamic(p: list[Any], q: list[Any]):
    x, weight, eps, variance_size = p
    if variance_size is not None:
        return None, "rms_norm has variance_size set; the fused op normalizes the whole row"
    return (x, weight, eps, None, q[1]), None


def _add_rms_dynamic(p: list[Any], q: list[Any]):
    x, residual, weight, eps, variance_size = p
    if variance_size is not None:
        return None, "fused_add_rms_norm has variance_size set; the fused op has none"
    return (x, weight, eps, residual, q[1]), None


def _silu_static(p: list[Any], q: list[Any]):
    return (p[0], q[1]), None


def _silu_group(p: list[Any], q: list[Any]):
    _x, group_size, column_major = q
    if column_major is not False:
        return None, (
            f"per_token_group_quant_fp8 has column_major_scales={column_major!r}; "
            f"the fused op writes row-major scales"
        )
    return (p[0], group_size), None


STATIC, DYNAMIC, GROUP = (
    "scaled_fp8_quant",
    "dynamic_per_token_scaled_fp8_quant",
    "per_token_group_quant_fp8",
)

# In the order they run (after the add fusion: its fused_add_rms_norm nodes are matched here).
QUANT_FUSIONS: tuple[QuantFusion, ...] = (
    QuantFusion(
        "fuse_rms_norm_static_fp8_quant",
        "rms_norm",
        STATIC,
        "rms_norm_static_fp8_quant",
        _rms_static,
        (("quant", None),),
        None,
    ),
    QuantFusion(
        "fuse_add_rms_norm_static_fp8_quant",
        "fused_add_rms_norm",
        STATIC,
        "fused_add_rms_norm_static_fp8_quant",
        _add_rms_static,
        (("quant", None), ("producer", 1)),
        0,
    ),
    QuantFusion(
        "fuse_rms_norm_dynamic_per_token_quant",
        "rms_norm",
        DYNAMIC,
        "rms_norm_dynamic_per_token_quant",
        _rms_dynamic,
        (("quant", 0), ("quant", 1), None),
        None,
    ),
    QuantFusion(
        "fuse_add_rms_norm_dynamic_per_token_quant",
        "fused_add_rms_norm",
        DYNAMIC,
        "rms_norm_dynamic_per_token_quant",
        _add_rms_dynamic,
        (("quant", 0), ("quant", 1), ("producer", 1)),
        0,
    ),
    QuantFusion(
        "fuse_silu_and_mul_fp8_quant",
        "silu_and_mul",
        STATIC,
        "silu_and_mul_fp8_quant",
        _silu_static,
        (("quant", None),),
        None,
    ),
    QuantFusion(
        "fuse_silu_and_mul_per_token_group_fp8_quant",
        "silu_and_mul",
        GROUP,
        "silu_and_mul_per_token_group_fp8_quant",
        _silu_group,
        (("quant", 0), ("quant", 1)),
        None,
    ),
)


def _outputs(node: fx.Node, index: int | None) -> tuple[fx.Node | None, bool]:
    """The node holding output ``index`` of ``node`` (``None``: the node itself) and
    whether every user of a tuple-valued ``node`` is a distinct ``getitem``."""
    if index is None:
        return node, True
    items = fx_utils.getitem_users(node)
    if items is None:
        return None, False
    return items.get(index), True


def _miss(spec: QuantFusion, quant: fx.Node, reason: str) -> None:
    _record.note_fusion_miss(spec.name, f"{_where(quant)}: {reason}")


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]+\n\s+([^\n]+)')


def _where(node: fx.Node) -> str:
    """``%name (target)`` and the user's line that made it: the innermost frame of the
    stack Dynamo recorded outside opcore's own op dispatch."""
    target = getattr(node.target, "_schema", None)
    text = f"%{node.name} ({node.target if target is not None else node.op})"
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    user = [f for f in frames if f"{os.sep}opcore{os.sep}ir{os.sep}" not in f[0]]
    if user:
        path, line, code = user[-1]
        text += f" at {os.path.basename(path)}:{line}: {code.strip()}"
    return text


def _fake_outputs(op: IrOp, fakes: list[Any]) -> Any:
    """The fused op's outputs on the fake arguments (validator included), in their mode."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([f for f in fakes if isinstance(f, torch.Tensor)])
    if mode is None:
        return op.fake_impl(*fakes)
    with mode:
        return op.fake_impl(*fakes)


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _mismatch(fused: Any, replaced: list[tuple[int, fx.Node]]) -> str | None:
    outs = _tuple(fused)
    for i, node in replaced:
        want = fx_utils.fake_value(node)
        got = outs[i] if i < len(outs) else None
        if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
            return f"output {i}: no tensor to compare (got {type(got).__name__})"
        if got.dtype != want.dtype or not fx_utils.same_shape(got.shape, want.shape):
            return (
                f"output {i} would be {tuple(got.shape)} {got.dtype} where the unfused graph "
                f"has {tuple(want.shape)} {want.dtype}"
            )
    return None


def _try_fuse(graph: fx.Graph, spec: QuantFusion, producer: fx.Node, ops: dict[str, IrOp]) -> bool:
    y, ok = _outputs(producer, spec.producer_output)
    if y is None or not ok:
        return False
    quant_target = ops[spec.quant].torch_op
    quants = [u for u in y.users if u.op == "call_function" and u.target is quant_target]
    quants = [q for q in quants if fx_utils.bind_args(ops[spec.quant], q)[0] is y]
    if not quants:
        return False  # not this pattern: nothing to note
    quant = quants[0]
    others = [u for u in y.users if u is not quant]
    if others:
        _miss(
            spec,
            quant,
            f"the intermediate %{y.name} is also used by "
            + ", ".join(_where(u) for u in others[:3])
            + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            + "; the fused op does not produce it",
        )
        return False
    fused_op = ops.get(spec.fused)
    if fused_op is None or fused_op.torch_op is None:
        _miss(spec, quant, f"op {spec.fused!r} is not registered")
        return False
    args, why = spec.args(
        fx_utils.bind_args(ops[spec.producer], producer),
        fx_utils.bind_args(ops[spec.quant], quant),
    )
    if args is None:
        _miss(spec, quant, why or "arguments do not fit the fused op")
        return False
    fakes = [fx_utils.fake_value(a) for a in args]
    try:
        fused_fake = _fake_outputs(fused_op, fakes)
        provider = fused_op.dispatch(*fakes).provider
    except Exception as exc:  # the validator or a provider's supports_args refused
        first = str(exc).splitlines()[0] if str(exc) else ""
        _miss(spec, quant, f"{spec.fused} is not usable here: {type(exc).__name__}: {first}")
        return False

    replaced: list[tuple[int, fx.Node]] = []
    for i, source in enumerate(spec.outputs):
        if source is None:
            continue
        node, ok = _outputs(quant if source[0] == "quant" else producer, source[1])
        if not ok:
            _miss(spec, quant, f"a {source[0]} output is used other than through getitem")
            return False
        if node is not None:
            replaced.append((i, node))
    why = _mismatch(fused_fake, replaced)
    if why is not None:
        _miss(spec, quant, f"{spec.fused} ({provider}) does not fit: {why}")
        return False

    anchor = _anchor(graph, producer, quant, args, replaced)
    if anchor is None:
        _miss(
            spec,
            quant,
            "an input of the fused op is computed after the producer and a replaced value is "
            "used before the quantization",
        )
        return False
    with graph.inserting_before(anchor):
        fused = graph.call_function(fused_op.torch_op, args)
        items = (
            {i: graph.call_function(operator.getitem, (fused, i)) for i, _ in replaced}
            if isinstance(fused_fake, (tuple, list))
            else {}
        )
    fused.meta.update({k: v for k, v in quant.meta.items() if k != "val"})
    fused.meta["val"] = fused_fake
    for i, node in replaced:
        new = items.get(i, fused)
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
    # users before the node they read: each is dead once the uses above moved
    for node in [*_tuple_users(quant), quant, *_tuple_users(producer), producer]:
        if not node.users:
            graph.erase_node(node)
    return True


def _tuple_users(node: fx.Node) -> list[fx.Node]:
    return [u for u in node.users if u.target is operator.getitem]


def _anchor(
    graph: fx.Graph,
    producer: fx.Node,
    quant: fx.Node,
    args: tuple[Any, ...],
    replaced: list[tuple[int, fx.Node]],
) -> fx.Node | None:
    """Where the fused node goes: at the producer when every input is defined before it;
    else at the quantization when no replaced value is used before it."""
    pos = fx_utils.order(graph)
    inputs = [a for a in args if isinstance(a, fx.Node)]
    if all(pos[a] < pos[producer] for a in inputs):
        return producer
    for _, node in replaced:
        if any(pos[u] < pos[quant] for u in node.users):
            return None
    return quant


def make_pass(spec: QuantFusion) -> Callable[[fx.Graph], int]:
    """The fusion pass of ``spec``: ``(graph) -> number of rewrites``. The ops are looked
    up by name when it runs (a pass over a graph without them does nothing)."""

    def fuse(graph: fx.Graph) -> int:
        ops = all_ops()
        if spec.producer not in ops or spec.quant not in ops:
            return 0
        target = ops[spec.producer].torch_op
        count = 0
        for producer in [n for n in graph.nodes if n.op == "call_function" and n.target is target]:
            if _try_fuse(graph, spec, producer, ops):
                count += 1
        return count

    fuse.__name__ = spec.name
    fuse.__qualname__ = spec.name
    fuse.__doc__ = f"{spec.producer} -> {spec.quant} => {spec.fused} (see `fuse_quant`)."
    return fuse


PASSES: dict[str, Callable[[fx.Graph], int]] = {s.name: make_pass(s) for s in QUANT_FUSIONS}
