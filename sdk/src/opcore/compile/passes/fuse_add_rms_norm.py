"""Fusion: a residual add whose result feeds ``rms_norm`` becomes ``fused_add_rms_norm``.

Matches, on the functional graph after AOTAutograd::

    s = aten.add.Tensor(a, b)            # same shape and dtype, no alpha, no broadcast
    y = opcore_ir.rms_norm.default(s, weight, eps, variance_size)

and rewrites it to::

    f = opcore_ir.fused_add_rms_norm.default(a, b, weight, eps, variance_size)
    y = f[0];  s = f[1]                  # every other user of s reads f[1]

The semantics are identical (``fused_add_rms_norm`` rounds the sum to the input dtype, as
``aten.add`` does, and normalizes the rounded sum). The fused node is placed where ``s`` was
when ``weight`` is already defined there, else where ``y`` was when nothing reads ``s``
in between; otherwise the pair is left alone.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from opcore.compile.passes import fx_utils
from opcore.ir import ops

NAME = "fuse_add_rms_norm"
aten = torch.ops.aten


def _plain_add(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.add.Tensor or len(node.args) != 2:
        return False
    if node.kwargs.get("alpha", 1) != 1:
        return False
    a, b = node.args
    va, vb, vs = fx_utils.fake_value(a), fx_utils.fake_value(b), fx_utils.fake_value(node)
    if not all(isinstance(v, torch.Tensor) for v in (va, vb, vs)):
        return False
    return (
        va.dtype == vb.dtype == vs.dtype
        and fx_utils.same_shape(va.shape, vb.shape)
        and fx_utils.same_shape(va.shape, vs.shape)
    )


def fuse_add_rms_norm(graph: fx.Graph) -> int:
    """Apply the rewrite everywhere it matches; returns the number of fusions."""
    rms = ops.rms_norm.torch_op
    fused = ops.fused_add_rms_norm.torch_op
    count = 0
    for norm in [n for n in graph.nodes if n.op == "call_function" and n.target is rms]:
        args = fx_utils.bind_args(ops.rms_norm, norm)
        add = args[0]
        if not isinstance(add, fx.Node) or not _plain_add(add):
            continue
        pos = fx_utils.order(graph)
        rest = args[1:]
        later_inputs = [a for a in rest if isinstance(a, fx.Node) and pos[a] > pos[add]]
        if not later_inputs:
            anchor = add
        elif not any(pos[add] < pos[u] < pos[norm] for u in add.users):
            anchor = norm
        else:
            continue
        with graph.inserting_before(anchor):
            node = graph.call_function(fused, (add.args[0], add.args[1], *rest))
            out = graph.call_function(operator.getitem, (node, 0))
            residual = graph.call_function(operator.getitem, (node, 1))
        node.meta.update(_meta_for(norm, add))
        out.meta.update(norm.meta)
        residual.meta.update(add.meta)
        norm.replace_all_uses_with(out)
        add.replace_all_uses_with(residual)
        graph.erase_node(norm)
        graph.erase_node(add)
        count += 1
    return count


def _meta_for(norm: fx.Node, add: fx.Node) -> dict:
    meta = {k: v for k, v in norm.meta.items() if k != "val"}
    vn, va = fx_utils.fake_value(norm), fx_utils.fake_value(add)
    if vn is not None and va is not None:
        meta["val"] = (vn, va)
    return meta
