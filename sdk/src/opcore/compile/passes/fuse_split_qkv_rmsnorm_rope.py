"""Fusion: QKV split + per-head ``rms_norm`` of q and k + ``rotary_embedding`` becomes one
``split_qkv_rmsnorm_rope``.

Matches, on the functional graph after AOTAutograd (reshapes may be ``view``,
``reshape`` or ``_unsafe_view``; a chain of them is allowed, or none)::

    parts = aten.split_with_sizes(qkv, [H*D, KV*D, KV*D], -1)
    q = reshape(parts[0], [..., H, D])
    q = opcore_ir.rms_norm(q, q_w, eps)
    q = reshape(q, [..., H*D])
    k = reshape(parts[1], [..., KV, D])
    k = opcore_ir.rms_norm(k, k_w, eps)
    k = reshape(k, [..., KV*D])
    q2, k2 = opcore_ir.rotary_embedding(positions, q, k, D, cos_sin_cache, is_neox)

and rewrites it to::

    q2, k2, v = opcore_ir.split_qkv_rmsnorm_rope(
        qkv, q_w, k_w, eps, positions, cos_sin_cache, H, KV, D, is_neox
    )

where ``v`` replaces ``parts[2]`` (same values; contiguous instead of a strided view).
Conditions: the q/k intermediates have no other users, both norms use the same epsilon and
no ``variance_size``, both or neither weight is given, the rotary's q and k are
``[*qkv.shape[:-1], heads * D]`` and ``positions`` is ``qkv.shape[:-1]``. The fused op
keeps fp32 between the norm and the rotation (one rounding instead of two), so outputs can
differ from the unfused chain by one rounding of the input dtype.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from opcore.compile.passes import fx_utils
from opcore.ir import ops

NAME = "fuse_split_qkv_rmsnorm_rope"
aten = torch.ops.aten
_RESHAPES = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _follow_reshapes(node: fx.Node) -> tuple[fx.Node, list[fx.Node]] | None:
    """From ``node``, walk single-user reshape nodes; return (last node, chain walked)."""
    chain = []
    while True:
        user = fx_utils.single_user(node)
        if user is None:
            return None
        if user.op == "call_function" and user.target in _RESHAPES and user.args[0] is node:
            chain.append(user)
            node = user
            continue
        return node, chain


def _match_norm(part: fx.Node):
    """``parts[i]`` -> reshapes -> rms_norm -> reshapes -> (final node, nodes, norm args)."""
    walked = _follow_reshapes(part)
    if walked is None:
        return None
    before, chain1 = walked
    norm = fx_utils.single_user(before)
    if norm is None or norm.target is not ops.rms_norm.torch_op:
        return None
    x, weight, eps, variance_size = fx_utils.bind_args(ops.rms_norm, norm)
    if x is not before or variance_size is not None or isinstance(eps, fx.Node):
        return None
    walked = _follow_reshapes(norm)
    if walked is None:
        return None
    after, chain2 = walked
    return after, [*chain1, norm, *chain2], (before, weight, eps)


def fuse_split_qkv_rmsnorm_rope(graph: fx.Graph) -> int:
    """Apply the rewrite everywhere it matches; returns the number of fusions."""
    count = 0
    for split in [
        n
        for n in graph.nodes
        if n.op == "call_function" and n.target is aten.split_with_sizes.default
    ]:
        if _try_fuse(graph, split):
            count += 1
    return count


def _try_fuse(graph: fx.Graph, split: fx.Node) -> bool:
    qkv, sizes = split.args[0], split.args[1]
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    qkv_val = fx_utils.fake_value(qkv)
    if not isinstance(qkv_val, torch.Tensor) or qkv_val.dim() < 2:
        return False
    if not isinstance(sizes, (list, tuple)) or len(sizes) != 3:  # sizes given as a node: skip
        return False
    int_sizes = [s for s in sizes if isinstance(s, int)]
    if dim not in (-1, qkv_val.dim() - 1) or len(int_sizes) != 3:
        return False
    parts = fx_utils.getitem_users(split)
    if parts is None or set(parts) - {0, 1, 2} or 0 not in parts or 1 not in parts:
        return False
    q_match, k_match = _match_norm(parts[0]), _match_norm(parts[1])
    if q_match is None or k_match is None:
        return False
    q_end, q_nodes, (q_in, q_w, q_eps) = q_match
    k_end, k_nodes, (k_in, k_w, k_eps) = k_match
    rotary = fx_utils.single_user(q_end)
    if (
        rotary is None
        or rotary.target is not ops.rotary_embedding.torch_op
        or fx_utils.single_user(k_end) is not rotary
    ):
        return False
    positions, query, key, head_size, cache, is_neox = fx_utils.bind_args(
        ops.rotary_embedding, rotary
    )
    if (
        query is not q_end
        or key is not k_end
        or not isinstance(head_size, int)
        or not isinstance(is_neox, bool)
    ):
        return False
    if q_eps != k_eps or (q_w is None) != (k_w is None):
        return False
    qv, kv = fx_utils.fake_value(q_in), fx_utils.fake_value(k_in)
    if qv.shape[-1] != head_size or kv.shape[-1] != head_size or qv.dim() < 2 or kv.dim() < 2:
        return False
    heads, kv_heads = int_sizes[0] // head_size, int_sizes[1] // head_size
    if int_sizes != [heads * head_size, kv_heads * head_size, kv_heads * head_size]:
        return False
    if not (
        fx_utils.known_equal(qv.shape[-2], heads) and fx_utils.known_equal(kv.shape[-2], kv_heads)
    ):
        return False
    lead = tuple(qkv_val.shape[:-1])
    if not (
        fx_utils.same_shape(fx_utils.fake_value(q_end).shape, (*lead, sizes[0]))
        and fx_utils.same_shape(fx_utils.fake_value(k_end).shape, (*lead, sizes[1]))
        and fx_utils.same_shape(fx_utils.fake_value(positions).shape, lead)
    ):
        return False
    outs = fx_utils.getitem_users(rotary)
    if outs is None:
        return False

    pos = fx_utils.order(graph)
    inputs = [a for a in (qkv, q_w, k_w, positions, cache) if isinstance(a, fx.Node)]
    latest = max(pos[a] for a in inputs)
    v_users = list(parts[2].users) if 2 in parts else []
    if latest < pos[split]:
        anchor = split
    elif not any(pos[u] < pos[rotary] for u in v_users):
        anchor = rotary
    else:
        return False

    args = (qkv, q_w, k_w, q_eps, positions, cache, heads, kv_heads, head_size, is_neox)
    with graph.inserting_before(anchor):
        fused = graph.call_function(ops.split_qkv_rmsnorm_rope.torch_op, args)
        items = [graph.call_function(operator.getitem, (fused, i)) for i in range(3)]
    fused.meta.update({k: v for k, v in rotary.meta.items() if k != "val"})
    q_out, k_out = (fx_utils.fake_value(outs[i]) if i in outs else None for i in (0, 1))
    v_out = fx_utils.fake_value(parts[2]) if 2 in parts else None
    fused.meta["val"] = (q_out, k_out, v_out)
    for i, item in enumerate(items):
        src = outs.get(i) if i < 2 else parts.get(2)
        if src is not None:
            item.meta.update(src.meta)
            src.replace_all_uses_with(item)
    dead = [*outs.values(), rotary, *reversed(q_nodes), *reversed(k_nodes), *parts.values(), split]
    for node in dead:
        if not node.users:
            graph.erase_node(node)
    for item in items:
        if not item.users:
            graph.erase_node(item)
    return True
