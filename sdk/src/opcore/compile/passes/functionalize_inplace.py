"""Before AOTAutograd: ``maybe_inplace`` nodes become the functional default overload, and
the graph inputs they were given are recorded as donated.

A ``maybe_inplace`` call donates its activations: the caller promises not to read them (or
any view of the same storage) afterwards. That promise is checked here, on Dynamo's graph,
where the user's code order is still intact: a later use is a `DonationError` naming both
nodes and the source lines. The functional overload is what AOTAutograd and the fusion
passes see; the donation is not lost, because clone elimination (after lowering) uses the
donated inputs recorded here and the graph's liveness to drop the clones an in-place
provider would otherwise need.
"""

from __future__ import annotations

import torch.fx as fx

from opcore.compile.passes import fx_utils


class DonationError(ValueError):
    """An activation passed to ``maybe_inplace`` is used after that call."""


def functionalize_inplace(gm: fx.GraphModule) -> list[int]:
    """Rewrite every ``opcore_ir.<op>.maybe_inplace`` node of ``gm`` to
    ``opcore_ir.<op>.default`` in place; return the indices (among the graph's
    placeholders) of the inputs that were donated. Raises `DonationError`."""
    graph = gm.graph
    _, inplace_targets = fx_utils.ir_targets()
    pos = fx_utils.order(graph)
    inputs = fx_utils.placeholders(graph)
    donated: set[int] = set()
    changed = False
    for node in list(graph.nodes):
        op = inplace_targets.get(node.target) if node.op == "call_function" else None
        if op is None:
            continue
        args = fx_utils.bind_args(op, node)
        for index, name in zip(op.activation_index, op.activations, strict=True):
            arg = args[index]
            if not isinstance(arg, fx.Node):
                continue
            # Views taken before the call share the donated storage; anything made after
            # it comes from the call's results (or elsewhere), not from the donation.
            group = [a for a in (fx_utils.aliases(graph, arg) or [arg]) if pos[a] < pos[node]]
            for alias in group:
                for user in alias.users:
                    if user is node:
                        continue
                    if user.op == "output":
                        raise DonationError(
                            _message(op.name, name, arg, node, user, "is returned by the graph")
                        )
                    if pos[user] > pos[node]:
                        raise DonationError(
                            _message(op.name, name, arg, node, user, "is used again")
                        )
                if alias.op == "placeholder":
                    donated.add(inputs.index(alias))
        node.target = op.torch_op
        changed = True
    if changed:
        graph.lint()
        gm.recompile()
    return sorted(donated)


def _message(op: str, param: str, arg: fx.Node, node: fx.Node, user: fx.Node, what: str) -> str:
    return (
        f"opcore.compile: argument {param!r} of {op}.maybe_inplace at {fx_utils.describe(node)} "
        f"donates {fx_utils.describe(arg)}, which {what} afterwards by {fx_utils.describe(user)}. "
        f"After maybe_inplace its contents are undefined: call ops.{op}(...) (the default "
        f"overload) or pass a clone."
    )
