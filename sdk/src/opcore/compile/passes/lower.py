"""Lowering: every ``opcore_ir`` node becomes the code of the provider that
``IrOp.dispatch`` picks for the node's fake tensors, under the compile's config.

Selection is eager dispatch itself (same priority list, same ``supports_args``, run on the
fake tensors AOTAutograd recorded), so a compiled graph runs the provider an eager call with
the same config and argument metadata would run. The provider is then traced into the
graph with Inductor's ``replace_by_example`` (``make_fx`` on the fake values): the native
function becomes aten ops Inductor can fuse with their neighbours; a provider built on
torch ops becomes those ops. The default overload's contract is kept: an in-place
provider is traced through its functional form, which clones the activations first; those
clones are tagged for `clone_elimination`.

A provider whose code cannot run on fake tensors (a raw Triton launch) is lowered to one
``opcore_impl::<op>.<provider>`` call (`opcore.compile.opaque`) and recorded as ``opaque``
with the tracing error; the same provider runs.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx as fx

from opcore.compile import opaque
from opcore.compile.passes import _graph
from opcore.compile.record import LoweringDecision
from opcore.ir.op import Impl, IrOp

logger = logging.getLogger("opcore.compile")

CLONE_TAG = "opcore_lowering_clone"
LOWERED_TAG = "opcore_lowered_from"


class LoweringError(RuntimeError):
    """A provider could be neither traced nor called opaquely for a node."""


def _clone_activations(op: IrOp, args: list[Any]) -> list[Any]:
    args = list(args)
    for index in op._activation_index:
        if isinstance(args[index], torch.Tensor):
            args[index] = args[index].clone()
    return args


def _opaque_replacement(op: IrOp, impl: Impl):
    target = opaque.get(op, impl)
    if not impl.inplace:

        def call(*args: Any) -> Any:
            return target(*args)

        return call

    def call_inplace(*args: Any) -> Any:
        args = _clone_activations(op, list(args))
        target(*args)
        outs = tuple(args[i] for i in op._activation_index)
        return outs if len(outs) > 1 else outs[0]

    return call_inplace


def _traced_replacement(op: IrOp, impl: Impl):
    fn = impl.functional

    def call(*args: Any) -> Any:
        return fn(*args)

    return call


def lower(graph: fx.Graph, decisions: list[LoweringDecision]) -> int:
    """Lower every ``opcore_ir`` node of ``graph`` (under the current config: the caller
    makes the compile's config current). Appends one `LoweringDecision` per node to
    ``decisions``; returns how many nodes were lowered."""
    from torch._inductor.pattern_matcher import (
        CallFunctionVarArgs,
        PatternMatcherPass,
        register_graph_pattern,
    )

    default_targets, inplace_targets = _graph.ir_targets()
    leftover = [n for n in graph.nodes if n.op == "call_function" and n.target in inplace_targets]
    if leftover:
        raise LoweringError(
            f"opcore.compile: {_graph.describe(leftover[0])} is a maybe_inplace node after "
            f"AOTAutograd; the in-place functionalization pass must run first"
        )
    present = {n.target for n in graph.nodes if n.op == "call_function" and n.target in default_targets}
    if not present:
        return 0
    patterns = PatternMatcherPass(pass_name="opcore_lowering")
    for target in present:
        register_graph_pattern(CallFunctionVarArgs(target), pass_dict=patterns)(
            _handler(default_targets[target], graph, decisions)
        )
    count = patterns.apply(graph)
    remaining = [n for n in graph.nodes if n.op == "call_function" and n.target in default_targets]
    if remaining:
        raise LoweringError(
            f"opcore.compile: {len(remaining)} opcore_ir node(s) were not lowered, first "
            f"{_graph.describe(remaining[0])}"
        )
    return count


def _handler(op: IrOp, graph: fx.Graph, decisions: list[LoweringDecision]):
    def handle(match: Any, *args: Any, **kwargs: Any) -> None:
        node = match.nodes[0]
        bound = _graph.bind_args(op, node)
        fake_args = [_graph.fake_value(a) for a in bound]
        impl = op.dispatch(*fake_args)
        priority = op.effective_priority()
        before = set(graph.nodes)
        how, error = "traced", None
        try:
            match.replace_by_example(_traced_replacement(op, impl), bound)
        except Exception as exc:  # recorded; the provider still runs, as an opaque call
            how, error = "opaque", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            logger.info("opcore.compile: %s -> %s not traceable (%s); lowered as an opaque call", node.name, impl.provider, error)
            try:
                match.replace_by_example(_opaque_replacement(op, impl), bound)
            except Exception as exc2:
                raise LoweringError(
                    f"opcore.compile: cannot lower {_graph.describe(node)} to provider "
                    f"{impl.provider!r}: tracing failed ({error}) and so did the opaque call "
                    f"({type(exc2).__name__}: {exc2})"
                ) from exc2
        for new in graph.nodes:
            if new in before:
                continue
            new.meta[LOWERED_TAG] = (op.name, impl.provider, node.name)
            if impl.inplace and new.target is torch.ops.aten.clone.default:
                new.meta[CLONE_TAG] = True
        decisions.append(
            LoweringDecision(
                node=node.name, op=op.name, provider=impl.provider, how=how,
                inplace=impl.inplace, priority=priority, trace_error=error,
            )
        )

    return handle
