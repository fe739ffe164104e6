"""opcore.compile: torch.compile with opcore's passes.

    import opcore.compile
    compiled = opcore.compile.compile(model, mode="inductor", fusion=True)
    # or: torch.compile(model, backend=opcore.compile.backend(mode="inductor"))
    with torch.inference_mode():
        y = compiled(x)
    print(opcore.compile.last_lowering_record())   # node -> provider, fusions, clones
    opcore.compile.info()                          # plain data for `opcore info`

Dynamo keeps every ``opcore_ir`` op one opaque node; before AOTAutograd ``maybe_inplace``
becomes the functional overload (donations checked and recorded); after it the fusion
passes rewrite op patterns, lowering replaces each op by the provider ``dispatch`` picks on
the node's fake tensors under the compile's mode, and clone elimination drops the copies
in-place providers do not need. See docs/compile.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from opcore.compile.backend import MODES, CompiledGraph, CompileError, OpcoreBackend
from opcore.compile.cache_key import cache_key, key_material
from opcore.compile.passes import (
    FUSION_PASSES,
    QUANT_FUSION_PASSES,
    DonationError,
    LoweringError,
    register_fusion_pass,
    unregister_fusion_pass,
)
from opcore.compile.record import CompileRecord, LoweringDecision, last_lowering_record


def backend(
    config: Any = None,
    *,
    mode: str | None = None,
    fusion: bool | Iterable[str] = True,
    inductor_config: dict | None = None,
) -> OpcoreBackend:
    """A ``torch.compile`` backend (see `OpcoreBackend`)."""
    return OpcoreBackend(config, mode=mode, fusion=fusion, inductor_config=inductor_config)


def compile(  # noqa: A001  (the natural name, as torch.compile)
    model: Any,
    *,
    mode: str | None = None,
    fusion: bool | Iterable[str] = True,
    config: Any = None,
    dynamic: bool | None = None,
    fullgraph: bool = False,
    inductor_config: dict | None = None,
) -> Any:
    """``torch.compile(model, backend=backend(...))``. The result carries the backend as
    ``.opcore_backend`` (its ``records`` list every compiled graph)."""
    be = backend(config, mode=mode, fusion=fusion, inductor_config=inductor_config)
    compiled = torch.compile(model, backend=be, dynamic=dynamic, fullgraph=fullgraph)
    try:
        # torch.compile is typed as returning a Callable; for a module it returns an
        # OptimizedModule, which takes attributes.
        compiled.opcore_backend = be  # type: ignore[attr-defined]
    except AttributeError:  # objects that refuse attributes still compile
        pass
    return compiled


def info(config: Any = None) -> dict[str, Any]:
    """Plain data for ``opcore info``: the pipeline, the fusion passes, the effective
    priority per op in each compile mode with its cache key, and the last compiled
    graph's record (``None`` before any)."""
    import copy

    from opcore.compile.backend import effective_priorities

    if config is None:
        from opcore.settings import get_current_config

        config = get_current_config()
    modes = {}
    for mode in MODES:
        cfg = copy.deepcopy(config)
        cfg.compilation.mode = mode
        modes[mode] = {
            "priorities": effective_priorities(cfg),
            "cache_key": cache_key(cfg, mode=mode),
        }
    last = last_lowering_record()
    return {
        "backend": (
            "opcore.compile.backend (torch.compile backend; Inductor pass as "
            "post_grad_custom_pre_pass)"
        ),
        "pipeline": [
            "functionalize_inplace (before AOTAutograd)",
            *FUSION_PASSES,
            "lower",
            "clone_elimination",
        ],
        "fusion_passes": list(FUSION_PASSES),
        "config_mode": config.compilation.mode,
        "modes": modes,
        "last_compile": None if last is None else last.to_dict(),
    }


__all__ = [
    "FUSION_PASSES",
    "MODES",
    "QUANT_FUSION_PASSES",
    "CompileError",
    "CompileRecord",
    "CompiledGraph",
    "DonationError",
    "LoweringDecision",
    "LoweringError",
    "OpcoreBackend",
    "backend",
    "cache_key",
    "compile",
    "info",
    "key_material",
    "last_lowering_record",
    "register_fusion_pass",
    "unregister_fusion_pass",
]
