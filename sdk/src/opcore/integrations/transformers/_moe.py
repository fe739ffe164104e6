"""The sparse MoE blocks of Qwen3-MoE, Qwen2-MoE and Mixtral through ``topk_softmax`` +
``fused_experts``.

`apply_moe(model)` gives every ``Qwen3MoeSparseMoeBlock`` / ``Qwen2MoeSparseMoeBlock`` /
``MixtralSparseMoeBlock`` of a loaded model an instance ``forward`` that computes the router
logits with the gate's own weight (``F.linear``, as transformers does), routes with
``opcore.ir.ops.topk_softmax`` (``renormalize``: the Qwen configs' ``norm_topk_prob``;
always for Mixtral) and runs ``opcore.ir.ops.fused_experts`` on the experts' weights.
Qwen2-MoE's block adds its shared expert, ``sigmoid(shared_expert_gate(x)) *
shared_expert(x)``, computed by the block's own modules as transformers computes it.
transformers 5.x stores each block's experts fused, ``gate_up_proj [E, 2I, H]`` (gate
rows first) and ``down_proj [E, H, I]``: exactly ``w13`` and ``w2``, so they are passed as
they are (no copy, and a later in-place weight load is seen). The rest of these models
(attention, norms) is not patched.

Differences from transformers, by design: ties between equal router probabilities go to
the lower expert id (``torch.topk`` leaves them unspecified), and the routing weights stay
float32 into the experts, which accumulate in float32 and round once (transformers casts
Qwen3's weights to the logits' dtype and rounds each expert's output); in float32 models the
results agree to float32 rounding.

Refused (`UnsupportedModelError`, nothing changed): other model types, blocks, routers or
experts of another class (subclasses included), blocks that already carry an instance
forward, an activation other than silu / gelu, ``output_router_logits=True`` (the router
module is not called, so its logits are not recorded), and a model already patched.
A block in training mode with Mixtral's jitter noise runs transformers' forward.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from opcore.integrations.transformers._patch import UnsupportedModelError

MOE_ATTR = "_opcore_moe_patch"
# model_type -> (module, block class, router class, experts class)
_NAMES = {
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeSparseMoeBlock", "Qwen3MoeTopKRouter", "Qwen3MoeExperts"),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeSparseMoeBlock", "Qwen2MoeTopKRouter", "Qwen2MoeExperts"),
    "mixtral": ("mixtral", "MixtralSparseMoeBlock", "MixtralTopKRouter", "MixtralExperts"),
}
# Blocks with a gated shared expert beside the routed ones (Qwen2-MoE).
_SHARED_EXPERT = frozenset({"qwen2_moe"})
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu"}
_CLASSES: dict[str, tuple[Any, Any, Any]] = {}
for _mt, (_mod, *_cls) in _NAMES.items():  # transformers' own classes, kept at import
    _m = importlib.import_module(f"transformers.models.{_mod}.modeling_{_mod}")
    _CLASSES[_mt] = (getattr(_m, _cls[0]), getattr(_m, _cls[1]), getattr(_m, _cls[2]))

MOE_MODEL_TYPES = tuple(_NAMES)


@dataclass
class MoePatch:
    """The blocks `apply_moe` patched (``routes``: module name -> route) and `revert`."""

    model: nn.Module
    blocks: dict[str, nn.Module] = field(default_factory=dict)
    routes: dict[str, str] = field(default_factory=dict)
    active: bool = True

    def revert(self) -> None:
        for block in self.blocks.values():
            block.__dict__.pop("forward", None)
        self.model.__dict__.pop(MOE_ATTR, None)
        self.active = False

    def __enter__(self) -> MoePatch:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            self.revert()


def _forward(block: Any, renormalize: bool, activation: str, original: Any, shared: bool):
    from opcore.ir import ops

    gate, experts = block.gate, block.experts
    if shared:
        shared_expert, shared_gate = block.shared_expert, block.shared_expert_gate

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        if block.training and getattr(block, "jitter_noise", 0) > 0:
            return original(hidden_states)
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        logits = F.linear(x, gate.weight)
        weights, ids = ops.topk_softmax(logits, gate.top_k, renormalize)
        out = ops.fused_experts(
            x, experts.gate_up_proj, experts.down_proj, weights, ids, activation
        )
        if shared:
            out = out + torch.sigmoid(shared_gate(x)) * shared_expert(x)
        return out.reshape(shape)

    return forward


def apply_moe(model: nn.Module) -> MoePatch:
    """Patch the sparse MoE blocks of a loaded Qwen3-MoE, Qwen2-MoE or Mixtral ``model`` in place
    (module docstring); returns the `MoePatch` (``.routes``, ``.revert()``)."""
    config: Any = getattr(model, "config", None)
    mt: Any = getattr(config, "model_type", None)
    if mt not in _CLASSES:
        raise UnsupportedModelError(
            f"opcore.integrations.transformers.apply_moe: model_type {mt!r} is not supported; "
            f"supported: {', '.join(MOE_MODEL_TYPES)}"
        )
    if MOE_ATTR in model.__dict__:
        raise UnsupportedModelError("apply_moe: the model is already patched; revert it first")
    block_cls, router_cls, experts_cls = _CLASSES[mt]
    problems = []
    activation = _ACTIVATIONS.get(str(getattr(config, "hidden_act", None)))
    if activation is None:
        problems.append(f"hidden_act={config.hidden_act!r} (supported: silu, gelu)")
    if getattr(config, "output_router_logits", False):
        problems.append("output_router_logits=True: the router module is not called")
    renormalize = bool(getattr(config, "norm_topk_prob", True)) if mt != "mixtral" else True
    found: dict[str, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, block_cls):
            if type(module) is not block_cls:
                problems.append(
                    f"{name}: {type(module).__qualname__} subclasses {block_cls.__name__}"
                )
            elif type(module.gate) is not router_cls or type(module.experts) is not experts_cls:
                problems.append(
                    f"{name}: router {type(module.gate).__qualname__} / experts "
                    f"{type(module.experts).__qualname__}, not transformers' own"
                )
            elif "forward" in module.__dict__:
                problems.append(f"{name}: has an instance forward (accelerate hooks?)")
            else:
                found[name] = module
    if not found and not problems:
        problems.append(f"no {block_cls.__name__} in the model")
    if problems:
        raise UnsupportedModelError(
            f"apply_moe: cannot patch {type(model).__name__} ({mt}); nothing was changed:\n  - "
            + "\n  - ".join(problems)
        )
    assert activation is not None  # a missing one is among the problems above
    patch = MoePatch(model)
    for name, block in found.items():
        shared = mt in _SHARED_EXPERT
        original = block_cls.forward.__get__(block)
        block.forward = _forward(block, renormalize, activation, original, shared)
        patch.blocks[name] = block
        patch.routes[name] = (
            f"topk_softmax(renormalize={renormalize}) + fused_experts({activation})"
            + (" + gated shared expert (transformers' modules)" if shared else "")
        )
    model.__dict__[MOE_ATTR] = patch
    return patch
