"""The supported architectures and what each config option is checked against.

`ARCHES` maps a transformers ``model_type`` to its `Arch`: where its classes live and how
its attention differs (Qwen3's per-head q/k RMSNorm; where the sliding window comes from).
`config_problems` lists, as one-line reasons, the config options the replacements do not
reproduce; an empty list means the config is supported.

The classes and functions an `Arch` hands out are transformers' own, kept when this module
is imported (`keep_originals`), not what the modeling module binds at the time of the call:
another library may rebind them (Liger's ``apply_liger_kernel_to_llama`` sets
``modeling_llama.LlamaRMSNorm = LigerRMSNorm``, ``LlamaMLP`` and ``apply_rotary_pos_emb``
likewise), and the patch must still recognise transformers' modules and compute
transformers' functions.
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
    # The class suffix of the sparse MoE block a decoder layer's ``mlp`` may be instead of
    # the MLP ("SparseMoeBlock"): `apply` leaves such blocks to transformers (`apply_moe`
    # patches them). None: every layer has the MLP.
    sparse_mlp: str | None = None
    # Whether the architecture has a dense MLP class (Mixtral's every layer is sparse).
    dense_mlp: bool = True

    @property
    def module_name(self) -> str:
        return f"transformers.models.{self.model_type}.modeling_{self.model_type}"

    def module(self) -> ModuleType:
        return importlib.import_module(self.module_name)

    def qualified(self, name: str) -> str:
        """``transformers.models.llama.modeling_llama.LlamaRMSNorm`` for ``"LlamaRMSNorm"``."""
        return f"{self.module_name}.{name}"

    def cls(self, suffix: str) -> type[Any]:  # a transformers class (untyped here)
        """transformers' class ``<prefix><suffix>`` as kept at import."""
        return _ORIGINALS[self.model_type][self.prefix + suffix]

    def bound_now(self, suffix: str) -> Any:
        """What the modeling module binds under ``<prefix><suffix>`` now (another library
        may have rebound it since import)."""
        return getattr(self.module(), self.prefix + suffix, None)

    def roles(self) -> tuple[str, ...]:
        """The roles (class-name suffixes) this architecture has, of `ROLES`."""
        return tuple(r for r in ROLES if r != "MLP" or self.dense_mlp)

    def classes(self) -> dict[str, type[Any]]:
        """role -> transformers class, for the roles the patch replaces."""
        return {role: self.cls(role) for role in self.roles()}

    def eager_attention(self):
        """transformers' ``eager_attention_forward`` of this architecture, as kept at import."""
        return _ORIGINALS[self.model_type]["eager_attention_forward"]

    def rotary_function(self):
        """transformers' ``apply_rotary_pos_emb`` of this architecture, as kept at import."""
        return _ORIGINALS[self.model_type]["apply_rotary_pos_emb"]

    def import_problems(self) -> list[str]:
        """Why the names kept at import are not transformers' own (they were rebound before
        this integration was imported); empty when they are."""
        return list(_NOT_ORIGINAL.get(self.model_type, ()))

    def cache_update_takes_kwargs(self) -> bool:
        # Later versions name the cache argument `cache` and hand the call's kwargs to
        # Cache.update; 5.17 names it `past_key_values` and does not.
        return "cache" in inspect.signature(self.cls("Attention").forward).parameters


ARCHES: dict[str, Arch] = {
    "llama": Arch("llama", "Llama", qk_norm=False, sliding=None),
    "mistral": Arch("mistral", "Mistral", qk_norm=False, sliding="config"),
    "qwen2": Arch("qwen2", "Qwen2", qk_norm=False, sliding="layer"),
    "qwen3": Arch("qwen3", "Qwen3", qk_norm=True, sliding="layer"),
    "qwen3_moe": Arch(
        "qwen3_moe", "Qwen3Moe", qk_norm=True, sliding="layer", sparse_mlp="SparseMoeBlock"
    ),
    # Qwen2-MoE's attention passes no sliding window (the model's mask carries it).
    "qwen2_moe": Arch(
        "qwen2_moe", "Qwen2Moe", qk_norm=False, sliding=None, sparse_mlp="SparseMoeBlock"
    ),
    "mixtral": Arch(
        "mixtral",
        "Mixtral",
        qk_norm=False,
        sliding="config",
        sparse_mlp="SparseMoeBlock",
        dense_mlp=False,
    ),
}


# The roles the patch replaces (class-name suffixes), the other classes it needs, and the
# module functions the replacement forwards call.
ROLES = ("RMSNorm", "MLP", "Attention", "DecoderLayer", "RotaryEmbedding")
_KEPT_CLASSES = (*ROLES, "Model", "PreTrainedModel")
_KEPT_FUNCTIONS = ("apply_rotary_pos_emb", "eager_attention_forward")
_ORIGINALS: dict[str, dict[str, Any]] = {}  # model_type -> name -> transformers' object
_NOT_ORIGINAL: dict[str, list[str]] = {}  # model_type -> why a kept name is not transformers'


def keep_originals() -> None:
    """Keep each architecture's classes and functions as its modeling module binds them
    now (once, at import). A name whose object was not defined in that module (its
    ``__module__`` / ``__qualname__`` differ) was rebound before this import: it is kept
    all the same, and `Arch.import_problems` says so, which `apply` reports."""
    for arch in ARCHES.values():
        if arch.model_type in _ORIGINALS:
            continue
        module = arch.module()
        kept, wrong = {}, []
        kept_classes = [c for c in _KEPT_CLASSES if c != "MLP" or arch.dense_mlp]
        suffixes = (*kept_classes, *((arch.sparse_mlp,) if arch.sparse_mlp else ()))
        names = [arch.prefix + suffix for suffix in suffixes] + list(_KEPT_FUNCTIONS)
        for name in names:
            obj = getattr(module, name)
            kept[name] = obj
            home = (getattr(obj, "__module__", None), getattr(obj, "__qualname__", None))
            if home != (arch.module_name, name):
                wrong.append(
                    f"{arch.qualified(name)} was already {home[0]}.{home[1]} when "
                    "opcore.integrations.transformers was imported (another library rebound "
                    "it); import opcore.integrations.transformers before patching with it"
                )
        _ORIGINALS[arch.model_type] = kept
        if wrong:
            _NOT_ORIGINAL[arch.model_type] = wrong


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


keep_originals()
