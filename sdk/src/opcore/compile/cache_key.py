"""The compile cache key: everything that changes what lowering produces.

``cache_key(config, mode=..., fusion=...)`` hashes: torch and opcore versions; the mode and
fusion flag; the name and source of every fusion pass run (all registered ones, or the
subset the backend was given, in pipeline order) and of the opcore pass modules
(the opaque-call module included); per
op, the effective priority under the config (so a platform default, a user list or a
``set_priority`` block open in this thread or task all count) and the identity hash
(source) of every registered provider; the identity of the tuning tables in use
(`opcore.tuning.identity`). It is the ``uuid()`` of the pass Inductor runs, so
Inductor's FX-graph and AOTAutograd caches miss when any of it changes, and the in-process
check of a compiled graph (`opcore.compile.backend`) recompiles.

Source hashes are computed once per object (module or function) per process: the code a
process runs does not change under it, and hashing the pipeline's sources is the costly
part of a key (milliseconds).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import json
from collections.abc import Iterable
from typing import Any

import torch

import opcore
from opcore.ir import all_ops
from opcore.ir.priority import MissingPropertyError
from opcore.platforms.kernels import ensure_kernels_loaded
from opcore.tuning import identity as tuning_identity


@functools.cache
def _source_hash(obj: Any) -> str:
    try:
        text = inspect.getsource(obj)
    except (OSError, TypeError):
        text = repr(obj)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def key_material(config: Any, *, mode: str, fusion: bool | Iterable[str]) -> dict[str, Any]:
    """The data `cache_key` hashes (JSON-serializable; shown by `opcore.compile.info`).
    ``fusion``: as `opcore.compile.backend`'s (a bool or the names of the passes run)."""
    from opcore.compile import opaque
    from opcore.compile import passes as _passes
    from opcore.compile.passes import (
        clone_elimination,
        functionalize_inplace,
        fuse_quant,
        fx_utils,
        lower,
    )

    ensure_kernels_loaded()
    selected = _passes.select_fusion_passes(fusion)
    cfg = copy.deepcopy(config)
    cfg.compilation.mode = mode
    ops: dict[str, Any] = {}
    for name, op in all_ops().items():
        # The effective priority is what lowering follows; a set_priority list that leaves
        # it unchanged does not change the compiled code, so it is not part of the key.
        try:
            chain: list[str] | str = op.effective_priority(cfg)
        except MissingPropertyError as exc:
            # No provider has the required properties: lowering a call of this op fails
            # loudly; a graph without one compiles as usual.
            chain = f"missing properties: {exc}"
        ops[name] = {
            "priority": chain,
            "providers": {p: impl.identity_hash() for p, impl in sorted(op.impls.items())},
            "properties": {p: sorted(impl.properties.names()) for p, impl in op.impls.items()},
        }
    return {
        "torch": torch.__version__,
        "opcore": opcore.__version__,
        "mode": mode,
        "fusion": bool(selected),
        # the tuning tables in use (docs/tuning.md): lowering launches what they choose
        "tuning": tuning_identity(),
        # docs/properties.md: they shape every op's priority above too, but a requirement
        # is a promise about the compiled code itself
        "required_properties": sorted(cfg.kernel.required_properties),
        # in pipeline order: a different subset, or order, is a different compile
        "fusion_passes": [[n, _source_hash(_passes.FUSION_PASSES[n])] for n in selected],
        # opaque: how provider calls (in-place ones included) become graph ops; _passes: the
        # order; fuse_quant: its passes share one matcher, which their own source does not show
        "pipeline": {
            m.__name__: _source_hash(m)
            for m in (
                _passes,
                fx_utils,
                functionalize_inplace,
                lower,
                clone_elimination,
                opaque,
                fuse_quant,
            )
        },
        "ops": ops,
    }


def cache_key(
    config: Any = None, *, mode: str | None = None, fusion: bool | Iterable[str] = True
) -> str:
    """Hex SHA-256 of `key_material` (``config``: default the current one; ``mode``:
    default ``config.compilation.mode``; ``fusion``: a bool or the fusion passes run)."""
    if config is None:
        from opcore.settings import get_current_config

        config = get_current_config()
    material = key_material(config, mode=mode or config.compilation.mode, fusion=fusion)
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
