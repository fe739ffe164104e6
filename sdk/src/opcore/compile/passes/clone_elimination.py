"""Clone elimination: drop the clones lowering put in front of in-place providers where
writing the original tensor cannot be observed.

It matters in ``eager`` mode, where the lowered graph runs as it is. Under Inductor the
in-place form is ``auto_functionalized`` and no lowering clone is left (Inductor's own
reinplacing decides where the kernel writes; see `opcore.compile.passes.lower`); the pass
still runs and finds nothing, or a clone whose removal keeps the graph functional.

Only clones tagged by `lower` are candidates (a clone the user wrote is left alone). A
clone ``c = clone(s)`` whose first use is node ``k`` is replaced by ``s`` when all hold:

- ``s`` is made inside the graph, or every graph input it aliases was donated (passed to
  ``maybe_inplace``);
- no node sharing ``s``'s storage (``s`` and its views) is used at or after ``k``, other
  than through ``c``, and none is a graph output;
- ``c`` has ``s``'s layout (sizes, strides, offset), so the provider sees the same tensor
  it would have written into;
- aliasing is known: every node involved carries a fake tensor.

Otherwise the clone stays, and the record says why.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from opcore.compile.passes import fx_utils
from opcore.compile.passes.lower import CLONE_TAG


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    def eq(x, y) -> bool:
        return statically_known_true(x == y)

    return (
        a.dim() == b.dim()
        and all(eq(x, y) for x, y in zip(a.shape, b.shape, strict=True))
        and all(eq(x, y) for x, y in zip(a.stride(), b.stride(), strict=True))
        and eq(a.storage_offset(), b.storage_offset())
        and a.dtype == b.dtype
    )


def eliminate_clones(
    graph: fx.Graph, donated_inputs: list[int], removed: list[str], kept: dict[str, str]
) -> int:
    """Apply the rule above to every tagged clone of ``graph``; fills ``removed`` (clone
    node names) and ``kept`` (name -> reason). Returns the number removed."""
    inputs = fx_utils.placeholders(graph)
    donated = {inputs[i] for i in donated_inputs if i < len(inputs)}
    count = 0
    for clone in [n for n in graph.nodes if n.meta.get(CLONE_TAG)]:
        reason = _why_kept(graph, clone, donated)
        if reason is not None:
            kept[clone.name] = reason
            continue
        source = clone.args[0]
        clone.replace_all_uses_with(source)
        graph.erase_node(clone)
        removed.append(clone.name)
        count += 1
    return count


def _why_kept(graph: fx.Graph, clone: fx.Node, donated: set[fx.Node]) -> str | None:
    source = clone.args[0]
    if not isinstance(source, fx.Node) or clone.kwargs.get("memory_format") not in (
        None,
        torch.preserve_format,
    ):
        return "not a plain clone of a graph value"
    pos = fx_utils.order(graph)
    if not clone.users:
        return "clone has no users"
    # From the clone's first use on, the provider may write it: the source must be dead by then.
    writer = min(clone.users, key=pos.__getitem__)
    sv, cv = fx_utils.fake_value(source), fx_utils.fake_value(clone)
    if not isinstance(sv, torch.Tensor) or not isinstance(cv, torch.Tensor):
        return "no fake tensor on the clone or its source"
    if not _same_layout(sv, cv):
        return "the clone's layout differs from its source (e.g. a strided view)"
    group = fx_utils.aliases(graph, source)
    if group is None:
        return "aliasing unknown (a node without a fake tensor)"
    return fx_utils.write_blocker(group, writer, pos, donated, "not donated", ignore=clone)
