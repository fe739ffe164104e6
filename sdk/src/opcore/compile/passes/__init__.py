"""The opcore pass pipeline, in order.

Before AOTAutograd, on Dynamo's graph:
  1. `functionalize_inplace`: ``maybe_inplace`` -> default overload; donated inputs recorded.

After AOTAutograd, on the functional aten graph where each ``opcore_ir`` op is still one node
(under Inductor this runs as ``post_grad_custom_pre_pass``, before Inductor's own pattern
passes, which would otherwise fold a residual add into a matmul's bias):
  2. fusion passes (`FUSION_PASSES`, when enabled: all of them or a chosen subset), in
     list order, under the compile's config (a pass may ask which provider would run);
  3. `lower`: each ``opcore_ir`` node -> its provider's code;
  4. `eliminate_clones`: clones in front of in-place providers dropped where safe.

A fusion pass is a function ``(graph: torch.fx.Graph) -> int`` (number of rewrites) that
keeps the graph functional and leaves ``opcore_ir`` nodes for lowering. A pass that finds
its pattern but cannot rewrite it says why with `opcore.compile.record.note_fusion_miss`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch.fx as fx

from opcore.compile.passes.clone_elimination import eliminate_clones
from opcore.compile.passes.functionalize_inplace import DonationError, functionalize_inplace
from opcore.compile.passes.fuse_add_rms_norm import fuse_add_rms_norm
from opcore.compile.passes.fuse_quant import PASSES as QUANT_PASSES
from opcore.compile.passes.fuse_split_qkv_rmsnorm_rope import fuse_split_qkv_rmsnorm_rope
from opcore.compile.passes.lower import LoweringError, lower
from opcore.compile.record import CompileRecord, collecting
from opcore.ir.dispatch import bump_generation

FusionPass = Callable[[fx.Graph], int]

# name -> pass; order matters: the QKV fusion consumes rms_norm nodes the add fusion must
# not see (their input is a split, never an add, so the order is for clarity only); the
# quantization fusions come after the add fusion, whose fused_add_rms_norm they match.
FUSION_PASSES: dict[str, FusionPass] = {
    "fuse_split_qkv_rmsnorm_rope": fuse_split_qkv_rmsnorm_rope,
    "fuse_add_rms_norm": fuse_add_rms_norm,
    **QUANT_PASSES,
}
# the FP8 quantization fusions among them (norm or activation + quant -> one op)
QUANT_FUSION_PASSES: tuple[str, ...] = tuple(QUANT_PASSES)


def select_fusion_passes(fusion: bool | Iterable[str]) -> list[str]:
    """The fusion passes a backend runs, in pipeline order: ``True`` all registered,
    ``False`` none, a collection of names those (an unknown name is a ``ValueError``
    listing the registered ones)."""
    if fusion is True or fusion is False:
        return list(FUSION_PASSES) if fusion else []
    if isinstance(fusion, str):
        raise TypeError(f"fusion must be a bool or a collection of pass names, not {fusion!r}")
    wanted = set(fusion)
    unknown = sorted(wanted - set(FUSION_PASSES))
    if unknown:
        raise ValueError(
            f"opcore.compile: unknown fusion pass(es) {', '.join(map(repr, unknown))}; "
            f"registered: {', '.join(FUSION_PASSES)}"
        )
    return [name for name in FUSION_PASSES if name in wanted]


def register_fusion_pass(name: str, fn: FusionPass) -> None:
    """Add a fusion pass (runs after the built-in ones). Part of the cache key by name and
    source, so adding or changing one recompiles."""
    if name in FUSION_PASSES:
        raise ValueError(f"fusion pass {name!r} is already registered")
    FUSION_PASSES[name] = fn
    bump_generation()  # compiled graphs re-check their cache key on their next call


def unregister_fusion_pass(name: str) -> None:
    del FUSION_PASSES[name]
    bump_generation()


def run_post_aot(graph: fx.Graph, record: CompileRecord, config) -> None:
    """Passes 2-4 on ``graph`` under ``config`` (made current while fusing and lowering, so
    dispatch sees the compile's mode and priorities). The fusion passes run are
    ``record.fusion_passes`` (when ``record.fusion``); their misses land in the record."""
    from opcore.settings import set_current_config

    with set_current_config(config):
        if record.fusion:
            with collecting(record):
                for name in record.fusion_passes:
                    fn = FUSION_PASSES.get(name)
                    if fn is None:  # unregistered since the backend chose it
                        record.fusion_misses.setdefault(name, []).append("pass not registered")
                        continue
                    fired = fn(graph)
                    if fired:
                        record.fusions[name] = record.fusions.get(name, 0) + fired
        lower(
            graph,
            record.lowered,
            functional_graph=record.mode == "inductor",
            donated_inputs=record.donated_inputs,
        )
    eliminate_clones(graph, record.donated_inputs, record.clones_removed, record.clones_kept)
    graph.lint()


__all__ = [
    "FUSION_PASSES",
    "QUANT_FUSION_PASSES",
    "DonationError",
    "LoweringError",
    "eliminate_clones",
    "functionalize_inplace",
    "fuse_add_rms_norm",
    "fuse_split_qkv_rmsnorm_rope",
    "lower",
    "register_fusion_pass",
    "run_post_aot",
    "select_fusion_passes",
]
