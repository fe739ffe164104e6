"""The supported architectures and what each config option is checked against.

`ARCHES` maps a transformers ``model_type`` to its `Arch`: where its classes live and how
its attention differs (Qwen3's per-head q/k RMSNorm; where the sliding window comes from).
`config_problems` lists, as one-line reasons, the config options the replacements do not
reproduce; an empty list means the config is supported.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any

# hidden_act -> gelu approximation (None: silu). Other activations are refused.
ACTIVATIONS: dict[str, str | None] = {
    "silu": None,
    "swish": None,
    "gelu": "none",
    "gelu_pytorch_tanh": "tanh",
}
# Rope types whose inverse frequencies and attention scaling are fixed at construction,
# so one cos/sin cache holds them. "dynamic" and "longrope" change them with the sequence
# length (transformers' dynamic_rope_update) and are refused.
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class Arch:
    model_type: str
    prefix: str  # class-name prefix in its modeling module: "Llama", "Qwen3", ...
    qk_norm: bool  # per-head q/k RMSNorm before rotary (Qwen3)
    sliding: (
        str | None
    )  # sliding_window passed to attention: None, "config" (Mistral), "layer" (Qwen2/3)

    @property
    def module_name(self) -> str:
        return f"transformers.models.{self.model_type}.modeling_{self.model_type}"

    def module(self) -> ModuleType:
        return importlib.import_module(self.module_name)

    def cls(self, suffix: str) -> type[Any]:  # a transformers class (untyped here)
        return getattr(self.module(), self.prefix + suffix)

    def classes(self) -> dict[str, type[Any]]:
        """role -> transformers class, for the roles the patch replaces."""
        return {
            role: self.cls(role)
            for role in ("RMSNorm", "MLP", "Attention", "DecoderLayer", "RotaryEmbedding")
        }

    def eager_attention(self):
        return self.module().eager_attention_forward

    def cache_update_takes_kwargs(self) -> bool:
        # Later versions name the cache argument `cache` and hand the call's kwargs to
        # Cache.update; 5.17 names it `past_key_values` and does not.
        return "cache" in inspect.signature(self.cls("Attention").forward).parameters


ARCHES: dict[str, Arch] = {
    "llama": Arch("llama", "Llama", qk_norm=False, sliding=None),
    "mistral": Arch("mistral", "Mistral", qk_norm=False, sliding="config"),
    "qwen2": Arch("qwen2", "Qwen2", qk_norm=False, sliding="layer"),
    "qwen3": Arch("qwen3", "Qwen3", qk_norm=True, sliding="layer"),
}


def arch_of(config: Any) -> Arch | None:
    model_type = getattr(config, "model_type", None)
    return ARCHES.get(model_type) if isinstance(model_type, str) else None


def rope_parameters(config: Any) -> dict:
    params = getattr(config, "rope_parameters", None)
    return params if isinstance(params, dict) else {}


def config_problems(config: Any) -> list[str]:
    """One line per config option the replacements do not support."""
    problems = []
    act = getattr(config, "hidden_act", None)
    if act not in ACTIVATIONS:
        problems.append(f"hidden_act={act!r} (supported: {', '.join(ACTIVATIONS)})")
    rope = rope_parameters(config)
    rope_type = rope.get("rope_type", rope.get("type"))
    if rope_type not in ROPE_TYPES:
        problems.append(
            f"rope_parameters rope_type={rope_type!r} (supported: {', '.join(ROPE_TYPES)})"
        )
    factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if factor not in (None, 1, 1.0):
        # These transformers classes rotate whole heads: the default rope type ignores the
        # factor, and a scaled type's shorter cos/sin make the unpatched attention fail.
        # There is no partial rotary to match (test_partial_rotary_has_no_reference_...).
        problems.append(
            f"partial_rotary_factor={factor!r} (these architectures rotate the whole head)"
        )
    heads, kv = (
        getattr(config, "num_attention_heads", 0),
        getattr(config, "num_key_value_heads", 0) or 0,
    )
    if not heads or not kv or heads % kv:
        problems.append(
            f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}"
        )
    if not getattr(config, "max_position_embeddings", 0):
        problems.append("max_position_embeddings is not set (it sizes the cos/sin cache)")
    return problems
