"""Patch a loaded model: check everything first, then change it all, or nothing.

`plan` walks the model and returns either a list of problems (nothing was touched) or a
`Plan`; `commit` carries it out and returns a `Patch`, whose `revert` puts every module
back. A patched module keeps its object, parameters and state-dict names; its class is
swapped for a subclass whose forward calls opcore (see `_forwards`), and fused weights
become non-persistent buffers the parameters are views of (see `_fuse`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from opcore.integrations.transformers import _forwards as fw
from opcore.integrations.transformers import _fuse
from opcore.integrations.transformers._arch import ACTIVATIONS, ROPE_TYPES, Arch, config_problems

# The opcore ops `apply(ops=...)` may name, and what each replaces.
OPS = {
    "rms_norm": "every RMSNorm module",
    "fused_add_rms_norm": "the post-attention residual add + RMSNorm of each decoder layer",
    "silu_and_mul": "the gated MLP activation (hidden_act silu)",
    "gelu_and_mul": "the gated MLP activation (hidden_act gelu / gelu_pytorch_tanh)",
    "rotary_embedding": "the rotary embedding of q and k (Llama, Mistral, Qwen2)",
    "split_qkv_rmsnorm_rope": "Qwen3's per-head q/k RMSNorm + rotary",
}
ROOT_ATTR = "_opcore_patch"
_SUBCLASSES: dict[tuple[type, type], type] = {}


class UnsupportedModelError(ValueError):
    """The model (or a config option of it) is not supported; nothing was changed."""


def subclass(mixin: type, cls: type) -> type:
    """``Opcore<cls>``: ``mixin`` in front of ``cls`` (one class per pair, reused)."""
    key = (mixin, cls)
    if key not in _SUBCLASSES:
        _SUBCLASSES[key] = type(
            f"Opcore{cls.__name__}", (mixin, cls), {"__module__": __name__, "_opcore_base": cls}
        )
    return _SUBCLASSES[key]


def is_patched_class(cls: type) -> bool:
    return "_opcore_base" in cls.__dict__


@dataclass
class _Step:
    module: nn.Module
    mixin: type
    attrs: dict[str, Any] = field(default_factory=dict)
    fuse: dict[str, tuple[str, ...]] = field(default_factory=dict)  # group -> child names
    cache: int | None = None  # rotary: rows of the cos/sin cache to build


@dataclass
class Plan:
    arch: Arch
    steps: list[_Step]
    routes: dict[str, str]


@dataclass
class Patch:
    """A committed patch. ``routes`` says, per replacement, which opcore op (and which
    weight layout) each kind of module now uses and how many modules; `revert` undoes it."""

    model: nn.Module
    arch: Arch
    routes: dict[str, str]
    _done: list[tuple[nn.Module, type, list[str], list[str], bool]] = field(
        default_factory=list, repr=False
    )
    active: bool = True

    def revert(self) -> None:
        """Put every patched module back (classes, attributes, buffers). Parameters keep
        their objects and values; fused ones stay views of one storage."""
        for module, cls, attrs, groups, cache in reversed(self._done):
            module.__class__ = cls
            for a in attrs:
                module.__dict__.pop(a, None)
            for g in groups:
                _fuse.unfuse(module, g)
            if cache:
                module._buffers.pop("_opcore_cos_sin_cache", None)
        self._done.clear()
        self.model.__dict__.pop(ROOT_ATTR, None)
        self.active = False

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc) -> None:
        if self.active:
            self.revert()

    def __str__(self) -> str:
        lines = [f"opcore patch of {type(self.model).__name__} ({self.arch.model_type}):"]
        lines += [f"  {k}: {v}" for k, v in self.routes.items()]
        return "\n".join(lines)


def _choose_ops(arch: Arch, config: Any, ops: Any) -> set[str]:
    hidden_act = getattr(config, "hidden_act", None)
    act = ACTIVATIONS.get(hidden_act) if isinstance(hidden_act, str) else None
    gated = "silu_and_mul" if act is None else "gelu_and_mul"
    rope = "split_qkv_rmsnorm_rope" if arch.qk_norm else "rotary_embedding"
    default = {"rms_norm", "fused_add_rms_norm", rope} | ({gated} if arch.dense_mlp else set())
    if ops is None:
        return default
    chosen = {ops} if isinstance(ops, str) else set(ops)
    unknown = sorted(chosen - set(OPS))
    if unknown:
        raise ValueError(
            f"opcore.integrations.transformers: unknown op(s) {unknown} in ops=; "
            f"known: {sorted(OPS)}"
        )
    foreign = sorted(chosen - default)
    if foreign:
        raise ValueError(
            f"opcore.integrations.transformers: ops {foreign} do not apply to this "
            f"{arch.model_type} model (hidden_act={config.hidden_act!r}); it uses "
            f"{sorted(default)}"
        )
    return chosen


def _not_transformers(arch: Arch, where: str, module: Any, suffix: str) -> list[str]:
    """Why the module in a slot that holds a ``<prefix><suffix>`` in transformers' model
    is not one (empty when it is, or when it is a subclass: that has its own reason)."""
    original = arch.cls(suffix)
    if isinstance(module, original):
        return []
    cls = type(module)
    why = [
        f"{where} is {cls.__qualname__} ({cls.__module__}), not transformers' {original.__name__}"
    ]
    bound = arch.bound_now(suffix)
    if bound is not original and isinstance(bound, type) and isinstance(module, bound):
        why.append(
            f"another library rebound {arch.qualified(original.__name__)} to "
            f"{bound.__module__}.{bound.__qualname__}, and the model was built of that class "
            "(opcore patches transformers' classes only: build the model of them)"
        )
    return why


def _instance_forward(module: nn.Module, where: str) -> str | None:
    if "forward" in module.__dict__:
        return (
            f"{where} ({type(module).__name__}) has an instance-level forward (an accelerate "
            "or other hook); it cannot be patched"
        )
    return None


def plan(model: nn.Module, arch: Arch, ops: Any = None) -> Plan | list[str]:
    """Check the whole model; return the `Plan`, or the problems (nothing changed)."""
    config: Any = model.config  # a transformers PretrainedConfig (not typed here)
    problems = arch.import_problems() or config_problems(config)
    if problems:
        return problems
    chosen = _choose_ops(arch, config, ops)
    classes = arch.classes()  # transformers' own, as kept at import
    classes_model = arch.cls("Model")
    by_class = {cls: role for role, cls in classes.items()}
    gelu = ACTIVATIONS[config.hidden_act]
    cache_kwargs = arch.cache_update_takes_kwargs()
    eager = arch.eager_attention()
    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
    steps: list[_Step] = []
    counts: Counter = Counter()
    reasons: dict[str, str] = {}
    head_dims = set()
    rotaries = []
    attn_patch = (not arch.qk_norm and "rotary_embedding" in chosen) or (
        arch.qk_norm and "split_qkv_rmsnorm_rope" in chosen
    )
    norms = "rms_norm" in chosen
    gated = bool({"silu_and_mul", "gelu_and_mul"} & chosen)
    # Slots of transformers' model that must hold transformers' class, for the ops chosen:
    # a module of another class there (built after another library rebound the class name)
    # would be left unpatched, or, for the fused add, computed with the wrong norm.
    layer_slots = [
        ("input_layernorm", "RMSNorm", norms),
        ("post_attention_layernorm", "RMSNorm", norms or "fused_add_rms_norm" in chosen),
        # (Mixtral has no dense MLP class: its layers' blocks must be transformers' sparse one)
        ("mlp", "MLP" if arch.dense_mlp else str(arch.sparse_mlp), gated or not arch.dense_mlp),
        ("self_attn", "Attention", True),  # patched on every route (see the Attention role)
    ]
    model_slots = [("norm", "RMSNorm", norms), ("rotary_emb", "RotaryEmbedding", attn_patch)]

    for name, module in model.named_modules():
        where = name or "<model>"
        cls = type(module)
        if is_patched_class(cls):
            problems.append(f"{where} is already patched by opcore; revert first")
            continue
        if cls is classes_model:
            for attr, suffix, needed in model_slots:
                if needed:
                    slot = f"{name}.{attr}" if name else attr
                    problems += _not_transformers(arch, slot, getattr(module, attr, None), suffix)
        role = by_class.get(cls)
        if role is None:
            sub = [r for c, r in by_class.items() if isinstance(module, c)]
            if sub:
                problems.append(
                    f"{where}: {cls.__qualname__} subclasses the {sub[0]} class and may change "
                    "its forward"
                )
            continue
        if role == "DecoderLayer":
            for attr, suffix, needed in layer_slots:
                sparse = arch.sparse_mlp
                if attr == "mlp" and sparse and type(module.mlp) is arch.cls(sparse):
                    counts["sparse_mlp"] += 1  # transformers' block: apply_moe's to patch
                    continue
                if needed:
                    slot = f"{where}.{attr}"
                    problems += _not_transformers(arch, slot, getattr(module, attr, None), suffix)
        if role == "RMSNorm":
            if "rms_norm" in chosen:
                if p := _instance_forward(module, where):
                    problems.append(p)
                steps.append(_Step(module, fw.RMSNormMixin))
                counts["rms_norm"] += 1
        elif role == "DecoderLayer":
            if "fused_add_rms_norm" in chosen:
                if p := _instance_forward(module, where):
                    problems.append(p)
                steps.append(_Step(module, fw.DecoderLayerMixin))
                counts["fused_add_rms_norm"] += 1
        elif role == "MLP":
            if {"silu_and_mul", "gelu_and_mul"} & chosen:
                if p := _instance_forward(module, where):
                    problems.append(p)
                why = _fuse.fusion_problem([module.gate_proj, module.up_proj])
                if why is None:
                    gate_up = ("gate_proj", "up_proj")
                    mlp_attrs = {"_opcore_gelu": gelu, "_opcore_fused_groups": {"gate_up": gate_up}}
                    steps.append(_Step(module, fw.FusedMLPMixin, mlp_attrs, {"gate_up": gate_up}))
                    counts["mlp_fused"] += 1
                else:
                    steps.append(_Step(module, fw.SplitMLPMixin, {"_opcore_gelu": gelu}))
                    counts["mlp_split"] += 1
                    reasons.setdefault("mlp", why)
        elif role == "Attention":
            # Patched on every route: with the rotary op chosen, rotary goes through it;
            # without, transformers' own attention runs with the apply_rotary_pos_emb kept
            # at import, so that a later rebinding of the module's function (Liger's rope)
            # cannot change a patched model.
            if p := _instance_forward(module, where):
                problems.append(p)
            if arch.qk_norm and norms:
                for attr in ("q_norm", "k_norm"):
                    slot = f"{where}.{attr}"
                    problems += _not_transformers(
                        arch, slot, getattr(module, attr, None), "RMSNorm"
                    )
            attrs = {
                "_opcore_qk_norm": arch.qk_norm, "_opcore_cache_kwargs": cache_kwargs,
                "_opcore_num_heads": n_heads, "_opcore_num_kv_heads": n_kv,
                "_opcore_sliding": arch.sliding, "_opcore_eager_attention": eager,
                "_opcore_apply_rotary": None,
            }  # fmt: skip
            if not attn_patch:
                attrs["_opcore_apply_rotary"] = arch.rotary_function()
                attrs["_opcore_fused_groups"] = {}
                steps.append(_Step(module, fw.AttentionMixin, attrs))
                counts["attn_transformers"] += 1
                continue
            d = module.head_dim
            head_dims.add(d)
            shapes = (
                module.q_proj.out_features,
                module.k_proj.out_features,
                module.v_proj.out_features,
            )
            if shapes != (n_heads * d, n_kv * d, n_kv * d):
                problems.append(
                    f"{where}: q/k/v projections give {shapes}, not heads x head_dim "
                    f"{(n_heads * d, n_kv * d, n_kv * d)}"
                )
            if arch.qk_norm:
                qn, kn = module.q_norm, module.k_norm
                if type(qn) is not classes["RMSNorm"] or type(kn) is not classes["RMSNorm"]:
                    problems.append(
                        f"{where}: q_norm / k_norm are not transformers' "
                        f"{classes['RMSNorm'].__name__}"
                    )
                elif qn.variance_epsilon != kn.variance_epsilon:
                    problems.append(
                        f"{where}: q_norm eps {qn.variance_epsilon} differs from k_norm eps "
                        f"{kn.variance_epsilon}"
                    )
                elif (
                    qn.weight.dtype != module.q_proj.weight.dtype
                    or kn.weight.dtype != module.q_proj.weight.dtype
                ):
                    problems.append(
                        f"{where}: q_norm / k_norm weights are not in the projections' dtype"
                    )
            why = _fuse.fusion_problem([module.q_proj, module.k_proj, module.v_proj])
            if why is None:
                attrs["_opcore_fused_groups"] = {"qkv": ("q_proj", "k_proj", "v_proj")}
                steps.append(
                    _Step(module, fw.AttentionMixin, attrs, {"qkv": ("q_proj", "k_proj", "v_proj")})
                )
                counts["attn_fused"] += 1
            else:
                attrs["_opcore_fused_groups"] = {}
                steps.append(_Step(module, fw.AttentionMixin, attrs))
                counts["attn_split"] += 1
                reasons.setdefault("attention", why)
        elif role == "RotaryEmbedding":
            if attn_patch:
                rope_type = getattr(module, "rope_type", None)
                if rope_type not in ROPE_TYPES:
                    problems.append(f"{where}: rope_type {rope_type!r} is not supported")
                if p := _instance_forward(module, where):
                    problems.append(p)
                rotaries.append(module)
                rows = int(config.max_position_embeddings)
                steps.append(
                    _Step(module, fw.RotaryMixin, {"_opcore_cache_rows": rows}, cache=rows)
                )
                if module.inv_freq.is_meta:
                    counts["cache_deferred"] += 1

    if attn_patch:
        if len(rotaries) != 1:
            problems.append(
                f"expected one {classes['RotaryEmbedding'].__name__}, found {len(rotaries)}"
            )
        else:
            rot_dim = 2 * rotaries[0].inv_freq.numel()
            bad = sorted(d for d in head_dims if d != rot_dim)
            if bad:
                problems.append(
                    f"rotary dim {rot_dim} differs from head_dim {bad[0]} (partial rotary is "
                    "not what these classes compute)"
                )
    if not counts["fused_add_rms_norm"] and not any(
        isinstance(m, classes["DecoderLayer"]) for m in model.modules()
    ):
        problems.append(f"no {classes['DecoderLayer'].__name__} found in {type(model).__name__}")
    # One float dtype for everything patched: the ops take weights in the activations'
    # dtype, and transformers would promote a mixed norm to fp32 where the ops cannot.
    dtypes = {p.dtype for step in steps for p in step.module.parameters()}
    if len(dtypes) > 1 or not dtypes <= {torch.float16, torch.bfloat16, torch.float32}:
        problems.append(
            f"the patched modules' parameters have dtypes {sorted(map(str, dtypes))}; one of "
            "float16, bfloat16, float32 is needed"
        )
    if problems:
        return list(dict.fromkeys(problems))
    return Plan(arch, steps, _routes(arch, counts, reasons, gelu))


def _routes(
    arch: Arch, counts: Counter, reasons: dict[str, str], gelu: str | None
) -> dict[str, str]:
    act = "silu_and_mul" if gelu is None else f"gelu_and_mul(approximate={gelu!r})"
    routes = {}
    if counts["rms_norm"]:
        routes["rms_norm"] = f"{counts['rms_norm']} RMSNorm modules -> rms_norm"
    if counts["fused_add_rms_norm"]:
        routes["fused_add_rms_norm"] = (
            f"{counts['fused_add_rms_norm']} decoder layers: post-attention residual add + "
            "RMSNorm -> fused_add_rms_norm"
        )
    if counts["mlp_fused"]:
        routes["mlp"] = f"{counts['mlp_fused']} MLPs: one fused gate_up GEMM -> {act}"
    if counts["mlp_split"]:
        routes["mlp_split"] = (
            f"{counts['mlp_split']} MLPs: gate and up GEMMs, concatenated -> {act} "
            f"(not fused: {reasons['mlp']})"
        )
    if counts["sparse_mlp"]:
        routes["sparse_mlp"] = (
            f"{counts['sparse_mlp']} sparse MoE blocks: transformers' (apply_moe patches them)"
        )
    rope = "split_qkv_rmsnorm_rope" if arch.qk_norm else "rotary_embedding (NeoX)"
    if counts["attn_fused"]:
        routes["attention"] = f"{counts['attn_fused']} attentions: one fused QKV GEMM -> {rope}"
    if counts["attn_split"]:
        how = "concatenated" if arch.qk_norm else "separate"
        routes["attention_split"] = (
            f"{counts['attn_split']} attentions: q/k/v GEMMs ({how}) -> {rope} "
            f"(not fused: {reasons['attention']})"
        )
    if counts["attn_transformers"]:
        routes["attention_transformers"] = (
            f"{counts['attn_transformers']} attentions: transformers' attention, with the "
            f"apply_rotary_pos_emb kept at import (no opcore op: {rope.split()[0]} was not "
            "chosen)"
        )
    if counts["cache_deferred"]:
        routes["rotary_cache"] = (
            "cos/sin cache built on the first forward (the rotary inv_freq is on the meta "
            "device now)"
        )
    return routes


def commit(model: nn.Module, p: Plan) -> Patch:
    """Carry out ``p``. If a step fails (out of memory while fusing), the steps done are
    reverted before the error propagates."""
    patch = Patch(model, p.arch, p.routes)
    try:
        for step in p.steps:
            m = step.module
            for group, children in step.fuse.items():
                _fuse.fuse(m, group, [getattr(m, c) for c in children])
            if step.cache is not None and not m.inv_freq.is_meta:
                # on the meta device the cache would stay meta (or become uninitialised
                # memory after to_empty): the patched forward builds it on its first call
                m.register_buffer(
                    "_opcore_cos_sin_cache", fw.build_cache(m, step.cache), persistent=False
                )
            m.__dict__.update(step.attrs)
            cls = type(m)
            m.__class__ = subclass(step.mixin, cls)
            patch._done.append((m, cls, list(step.attrs), list(step.fuse), step.cache is not None))
    except BaseException:
        # a half-done step: drop what it added (classes are swapped last, so it has none)
        m = step.module
        for g in step.fuse:
            _fuse.unfuse(m, g)
        m._buffers.pop("_opcore_cos_sin_cache", None)
        for a in step.attrs:
            m.__dict__.pop(a, None)
        patch.revert()
        raise
    model.__dict__[ROOT_ATTR] = patch
    return patch
