"""opcore layers offered to vLLM through ``CustomOp.register_oot``.

Only layers vLLM's IR does not cover. vLLM's ``RMSNorm`` already calls ``vllm.ir.ops.rms_norm``
/ ``fused_add_rms_norm`` (served by the IR providers of `opcore_vllm._ir`), so it needs no
layer adapter.

Each adapter names the vLLM class it replaces and the parameters of that class's
``__init__`` and ``forward_native`` it was written for; ``inspect.signature`` of the
installed class must match them exactly, or the adapter refuses with one line and the
class stays vLLM's own. An adapter is registered only when ``OPCORE_VLLM_LAYERS`` names it
(``all`` for every one): registering replaces the class vLLM instantiates, so it is never
done by merely installing the bridge.

The replacement is a subclass of vLLM's class, so it builds, loads weights and runs
``forward_native`` exactly as vLLM's; only the enabled custom-op route (``forward_cuda``,
``forward_cpu``, ``forward_hip``, ``forward_xpu``, ``forward_tpu``, ``forward_oot``: the one
vLLM picks when ``compilation_config.custom_ops`` enables the op) goes to opcore. With the
op disabled (``custom_ops=["-rotary_embedding"]``, or ``"none"`` as under Inductor) vLLM
calls its own ``forward_native``. The subclass keeps vLLM's custom-op name, so that config
still decides.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from collections.abc import Callable
from typing import Any

LAYERS_VARIABLE = "OPCORE_VLLM_LAYERS"

_ROUTES = (
    "forward_cuda",
    "forward_hip",
    "forward_xpu",
    "forward_cpu",
    "forward_tpu",
    "forward_oot",
)

_E = inspect.Parameter.empty


@dataclasses.dataclass(frozen=True)
class LayerAdapter:
    """One opcore route for one vLLM ``CustomOp`` class."""

    name: str  # the key in OPCORE_VLLM_LAYERS and in reports
    module: str  # where vLLM defines the class
    cls: str
    # (name, default) of each parameter, ``self`` included, as written for
    init: tuple[tuple[str, Any], ...]
    forward: tuple[tuple[str, Any], ...]
    requires: tuple[str, ...]  # other members of vLLM's class the adapter uses
    build: Callable[[type], type]  # vLLM's class -> the subclass registered


def _params(fn: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((p.name, p.default) for p in inspect.signature(fn).parameters.values())


def _show(params: tuple[tuple[str, Any], ...]) -> str:
    return ", ".join(n if d is _E else f"{n}={d!r}" for n, d in params)


def check(adapter: LayerAdapter, vllm_cls: type) -> str | None:
    """Why ``adapter`` does not fit ``vllm_cls``, or None when it does."""
    for what, expected, fn in (
        ("__init__", adapter.init, vllm_cls.__init__),
        ("forward_native", adapter.forward, getattr(vllm_cls, "forward_native", None)),
    ):
        if fn is None:
            return f"vLLM's {adapter.cls} has no {what}"
        found = _params(fn)
        if found != expected:
            return (
                f"vLLM's {adapter.cls}.{what}({_show(found)}) is not the "
                f"({_show(expected)}) the adapter was written for"
            )
    missing = [m for m in adapter.requires if not hasattr(vllm_cls, m)]
    if missing:
        return f"vLLM's {adapter.cls} lacks {', '.join(missing)}"
    return None


# ------------------------------------------------------------------ rotary embedding
def _rotary_subclass(base: type) -> type:
    import opcore.ir

    op = opcore.ir.get_op("rotary_embedding")

    def opcore_forward(self: Any, positions: Any, query: Any, key: Any = None) -> Any:
        # vLLM's kernel route rotates query and key in place and returns them; so does this.
        cache = self._match_cos_sin_cache_dtype(query)
        args = (positions, query, key, self.head_size, cache, self.is_neox_style)
        try:
            op.validate(*args)
        except Exception:  # opcore refuses these arguments: vLLM's own computation
            q, k = self.forward_native(positions, query, key)
        else:
            q, k = op.maybe_inplace(*args)
        if q is not query:
            query.copy_(q)
        if key is not None and k is not key:
            key.copy_(k)
        return query, key

    namespace: dict[str, Any] = {route: opcore_forward for route in _ROUTES}
    namespace["opcore_route"] = True
    namespace["__module__"] = __name__
    namespace["__doc__"] = f"vLLM's {base.__name__}; its enabled route is opcore's op."
    return type(f"Opcore{base.__name__}", (base,), namespace)


ROTARY = LayerAdapter(
    name="rotary_embedding",
    module="vllm.model_executor.layers.rotary_embedding.base",
    cls="RotaryEmbedding",
    init=(
        ("self", _E),
        ("head_size", _E),
        ("rotary_dim", _E),
        ("max_position_embeddings", _E),
        ("base", _E),
        ("is_neox_style", _E),
        ("dtype", _E),
        ("init_cache", True),
    ),
    forward=(("self", _E), ("positions", _E), ("query", _E), ("key", None)),
    requires=("_match_cos_sin_cache_dtype", "register_oot"),
    build=_rotary_subclass,
)

ADAPTERS: tuple[LayerAdapter, ...] = (ROTARY,)

# opcore layers with no adapter, and why (reported, never registered).
NOT_ADAPTED: dict[str, str] = {
    "split_qkv_rmsnorm_rope": (
        "vLLM 0.33 has no CustomOp or PluggableLayer for a fused split-QKV norm + rope (its "
        "QK-norm/rope fusion is a compilation pass, fuse_qk_norm_rope_kvcache), so there is "
        "no class to register_oot"
    ),
    "fused_moe": (
        "vLLM's FusedMoE is composed at load time (router, RoutedExperts, a quantization "
        "method's apply(layer, x, topk_weights, topk_ids, ...), expert/tensor parallel "
        "and modular kernels with their own weight layouts); no single class signature maps "
        "onto opcore.layers.FusedMoE, so no adapter would be safe"
    ),
}


def wanted(environ: Any = None) -> set[str]:
    """The adapter names ``OPCORE_VLLM_LAYERS`` enables (``all``: every one)."""
    text = (environ if environ is not None else os.environ).get(LAYERS_VARIABLE, "")
    names = {n.strip() for n in text.split(",") if n.strip()}
    if "all" in names:
        return {a.name for a in ADAPTERS}
    return names


def register_layers(report: Any, adapters: tuple[LayerAdapter, ...] = ADAPTERS) -> None:
    """Register the enabled adapters that fit the installed vLLM; refusals and the
    layers left to vLLM go to ``report``."""
    from vllm.model_executor.custom_op import op_registry_oot

    enabled = wanted()
    known = {a.name for a in adapters} | set(NOT_ADAPTED)
    for name in sorted(enabled - known):
        report.refuse(f"layer.{name}", f"{LAYERS_VARIABLE} names it, but no adapter has it")
    for name, why in NOT_ADAPTED.items():
        report.refuse(f"layer.{name}", why)
    for adapter in adapters:
        try:
            vllm_cls = getattr(importlib.import_module(adapter.module), adapter.cls)
        except (ImportError, AttributeError) as exc:
            report.refuse(f"layer.{adapter.name}", f"{adapter.module}.{adapter.cls}: {exc}")
            continue
        why = check(adapter, vllm_cls)
        if why is not None:
            report.refuse(f"layer.{adapter.name}", why)
            continue
        if adapter.name not in enabled:
            report.layers[adapter.name] = f"available, off ({LAYERS_VARIABLE} does not name it)"
            continue
        current = op_registry_oot.get(vllm_cls.__name__)
        if current is not None:
            if getattr(current, "opcore_route", False):
                report.layers[adapter.name] = f"registered ({current.__name__})"
            else:  # someone else's out-of-tree class: never replaced
                report.refuse(
                    f"layer.{adapter.name}",
                    f"{vllm_cls.__name__} already has an out-of-tree class "
                    f"({current.__qualname__})",
                )
            continue
        sub = adapter.build(vllm_cls)
        vllm_name = getattr(vllm_cls, "name", None)
        vllm_cls.register_oot(sub)
        if vllm_name is not None:
            # register_oot names the class by vLLM's class name; vLLM's custom_ops config
            # (+rotary_embedding / -rotary_embedding) speaks the registered op name.
            sub.name = vllm_name
        report.layers[adapter.name] = f"registered ({sub.__name__})"
