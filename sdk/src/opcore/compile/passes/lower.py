"""Lowering: every ``opcore_ir`` node becomes the code of the provider that
``IrOp.dispatch`` picks for the node's fake tensors, under the compile's config.

Selection is eager dispatch itself (same priority list, same ``supports_args``, run on the
fake tensors AOTAutograd recorded), so a compiled graph runs the provider an eager call with
the same config and argument metadata would run. The provider is then traced into the
graph with Inductor's ``replace_by_example`` (``make_fx`` on the fake values): the native
function becomes aten ops Inductor can fuse with their neighbours; a provider built on
torch ops becomes those ops. The default overload's contract is kept (the caller's
tensors are never changed); for an in-place provider (``Impl.inplace``) lowering picks
one of two forms per node:

- **in place**, when every activation may be written: each is made in the graph (or, in
  ``eager`` mode only, is a donated graph input), no alias of it is read at or after the
  call or returned, and no two activations share storage. The provider runs on clones of
  the activations (tagged for `clone_elimination`, which drops them);
- **out of place** otherwise, when the provider has its own out-of-place kernel
  (``register_impl(..., functional=)``): that kernel runs and nothing is written or
  cloned. A provider without one runs in place on clones that stay.

Under Inductor (``functional_graph=True``) the in-place form is traced through Python
functionalization (AOTAutograd's), so the graph gets ``auto_functionalized(<in-place
op>)``, never a raw mutation. Inductor assumes the post-grad graph is functional: its
``remove_noop_ops`` deletes every same-layout ``clone``, so a clone guarding a raw
mutation is removed and the provider writes the clone's source (a graph input, i.e. the
caller's tensor, or a value still read later). ``auto_functionalized`` is the form
Inductor's reinplacing pass understands: it writes in place exactly where the input is
dead and not a graph input, and copies otherwise. Graph inputs are never written under
Inductor (a donated one included): a mutated input makes Inductor skip CUDA graphs.

A provider whose code cannot run on fake tensors (a raw Triton launch) is lowered to one
``opcore_impl::<op>__<provider>`` call (`opcore.compile.opaque`) and recorded as ``opaque``
with the tracing error; the same provider runs.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx as fx

from opcore.compile import opaque
from opcore.compile.passes import fx_utils
from opcore.compile.record import LoweringDecision
from opcore.ir import Impl, IrOp

logger = logging.getLogger("opcore.compile")

CLONE_TAG = "opcore_lowering_clone"
LOWERED_TAG = "opcore_lowered_from"


class LoweringError(RuntimeError):
    """A provider could be neither traced nor called opaquely for a node."""


def _clone_activations(op: IrOp, args: list[Any]) -> list[Any]:
    args = list(args)
    for index in op.activation_index:
        if isinstance(args[index], torch.Tensor):
            args[index] = args[index].clone()
    return args


def _functionalized(fn):
    """``fn`` traced as a functional graph: a mutation of a (cloned) activation becomes
    ``auto_functionalized`` (custom ops) or the out-of-place aten op."""

    from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize

    def call(*args: Any) -> Any:
        # Python functionalization (as AOTAutograd's): it turns a mutating custom op into
        # auto_functionalized, which torch.func.functionalize (C++) refuses to do.
        return dispatch_functionalize(fn, FunctionalTensorMode())(*args)

    return call


def _opaque_replacement(op: IrOp, impl: Impl, inplace: bool, functional_graph: bool):
    if not impl.inplace or not inplace:
        target = opaque.get(op, impl, out_of_place=impl.inplace)

        def call(*args: Any) -> Any:
            return target(*args)

        return call

    target = opaque.get(op, impl)

    def call_inplace(*given: Any) -> Any:
        args = _clone_activations(op, list(given))
        target(*args)
        outs = tuple(args[i] for i in op.activation_index)
        return outs if len(outs) > 1 else outs[0]

    return _functionalized(call_inplace) if functional_graph else call_inplace


def _traced_replacement(op: IrOp, impl: Impl, inplace: bool, functional_graph: bool):
    if not impl.inplace or not inplace:
        fn = impl.functional  # for an in-place provider: its out-of-place kernel

        def call(*args: Any) -> Any:
            return fn(*args)

        return call

    impl_fn = impl.impl_fn

    def call_inplace(*args: Any) -> Any:
        return impl_fn(*_clone_activations(op, list(args)))

    return _functionalized(call_inplace) if functional_graph else call_inplace


def why_not_writable(
    graph: fx.Graph, node: fx.Node, op: IrOp, bound: list[Any], writable_inputs: set[fx.Node]
) -> str | None:
    """``None`` when ``node``'s provider may write every activation of ``bound`` (see the
    module docstring), else the reason it may not. ``writable_inputs``: the graph inputs
    that may be written (donated ones in ``eager`` mode; none under Inductor)."""
    pos = fx_utils.order(graph)
    seen: set[fx.Node] = set()
    for index in op.activation_index:
        act = bound[index]
        if act is None:
            continue
        if not isinstance(act, fx.Node):
            return f"activation {op.param_names[index]!r} is not a graph value"
        group = fx_utils.aliases(graph, act)
        if group is None:
            return f"aliasing of %{act.name} is unknown (a node without a fake tensor)"
        if seen & set(group):
            return f"activation %{act.name} shares storage with another activation"
        seen.update(group)
        why = fx_utils.write_blocker(
            group, node, pos, writable_inputs, "written only when donated, never under Inductor"
        )
        if why is not None:
            return why
    return None


_NO_INPUTS: set[fx.Node] = set()


def lower(
    graph: fx.Graph,
    decisions: list[LoweringDecision],
    *,
    functional_graph: bool = False,
    donated_inputs: list[int] | None = None,
) -> int:
    """Lower every ``opcore_ir`` node of ``graph`` (under the current config: the caller
    makes the compile's config current). Appends one `LoweringDecision` per node to
    ``decisions``; returns how many nodes were lowered.

    ``functional_graph``: the graph must stay functional (Inductor): in-place providers
    go in as ``auto_functionalized`` and graph inputs are never written.
    ``donated_inputs``: indices of graph inputs an in-place provider may write (ignored
    when ``functional_graph``)."""
    from torch._inductor.pattern_matcher import (
        CallFunctionVarArgs,
        PatternMatcherPass,
        register_graph_pattern,
    )

    default_targets, inplace_targets = fx_utils.ir_targets()
    leftover = [n for n in graph.nodes if n.op == "call_function" and n.target in inplace_targets]
    if leftover:
        raise LoweringError(
            f"opcore.compile: {fx_utils.describe(leftover[0])} is a maybe_inplace node after "
            f"AOTAutograd; the in-place functionalization pass must run first"
        )
    present = {
        n.target for n in graph.nodes if n.op == "call_function" and n.target in default_targets
    }
    if not present:
        return 0
    if functional_graph:
        writable = _NO_INPUTS
    else:
        inputs = fx_utils.placeholders(graph)
        writable = {inputs[i] for i in donated_inputs or () if i < len(inputs)}
    patterns = PatternMatcherPass(pass_name="opcore_lowering")
    for target in present:
        register_graph_pattern(CallFunctionVarArgs(target), pass_dict=patterns)(
            _handler(default_targets[target], graph, decisions, functional_graph, writable)
        )
    count = patterns.apply(graph)
    remaining = [n for n in graph.nodes if n.op == "call_function" and n.target in default_targets]
    if remaining:
        raise LoweringError(
            f"opcore.compile: {len(remaining)} opcore_ir node(s) were not lowered, first "
            f"{fx_utils.describe(remaining[0])}"
        )
    return count


def _handler(
    op: IrOp,
    graph: fx.Graph,
    decisions: list[LoweringDecision],
    functional_graph: bool,
    writable: set[fx.Node],
):
    def handle(match: Any, *args: Any, **kwargs: Any) -> None:
        node = match.nodes[0]
        bound = fx_utils.bind_args(op, node)
        fake_args = [fx_utils.fake_value(a) for a in bound]
        impl = op.dispatch(*fake_args)
        priority = op.effective_priority()
        inplace, form = impl.inplace, None
        if impl.inplace:
            why = why_not_writable(graph, node, op, bound, writable)
            if why is not None and opaque.has_out_of_place(impl):
                inplace, form = False, f"out-of-place kernel: {why}"
            elif why is not None:
                form = f"in place on copies (no out-of-place kernel): {why}"
        before = set(graph.nodes)
        how, error = "traced", None
        try:
            match.replace_by_example(
                _traced_replacement(op, impl, inplace, functional_graph), bound
            )
        except Exception as exc:  # recorded; the provider still runs, as an opaque call
            how, error = (
                "opaque",
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            )
            logger.info(
                "opcore.compile: %s -> %s not traceable (%s); lowered as an opaque call",
                node.name,
                impl.provider,
                error,
            )
            try:
                match.replace_by_example(
                    _opaque_replacement(op, impl, inplace, functional_graph), bound
                )
            except Exception as exc2:
                raise LoweringError(
                    f"opcore.compile: cannot lower {fx_utils.describe(node)} to provider "
                    f"{impl.provider!r}: tracing failed ({error}) and so did the opaque call "
                    f"({type(exc2).__name__}: {exc2})"
                ) from exc2
        for new in graph.nodes:
            if new in before:
                continue
            new.meta[LOWERED_TAG] = (op.name, impl.provider, node.name)
            if inplace and new.target is torch.ops.aten.clone.default:
                new.meta[CLONE_TAG] = True
        decisions.append(
            LoweringDecision(
                node=node.name,
                op=op.name,
                provider=impl.provider,
                how=how,
                inplace=inplace,
                priority=priority,
                trace_error=error,
                form=form,
            )
        )

    return handle
