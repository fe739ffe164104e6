"""Run Hugging Face transformers Llama, Mistral, Qwen2 and Qwen3 models through opcore.

Install with ``pip install 'opcore[transformers]'`` (transformers >=5.17,<5.25). Then::

    from opcore.integrations import transformers as oc_hf
    patch = oc_hf.apply(model)        # a loaded PreTrainedModel; patch.revert() undoes it

or, before loading, ``oc_hf.apply_to_llama()`` (no model): every Llama model that
``from_pretrained`` / ``from_config`` returns afterwards comes back patched.

What is replaced (each through `opcore.ir.ops`, so the platform's priority picks the
kernel and ``opcore info`` shows it): every RMSNorm (``rms_norm``); each decoder layer's
post-attention residual add + RMSNorm (``fused_add_rms_norm``); the gated MLP activation
(``silu_and_mul`` / ``gelu_and_mul``) on one fused gate-up GEMM when the two projections
are plain ``nn.Linear`` of one dtype and device, else on the two outputs concatenated;
the rotary embedding (``rotary_embedding``, NeoX style, from a cos/sin cache built once)
on q and k of one fused QKV GEMM; for Qwen3, q/k RMSNorm + rotary as one
``split_qkv_rmsnorm_rope``. `Patch.routes` says which route each module took.

Refused, with `UnsupportedModelError` naming the reason, and nothing changed: other
architectures, activations other than silu / gelu / gelu_pytorch_tanh, rope types
other than default / linear / llama3 / yarn, partial rotary, subclasses of the patched
classes, modules of another class where the model has transformers' (a model built after
another library rebound a class name, as Liger's ``apply_liger_kernel_to_llama`` does),
modules with accelerate-style instance forwards, already patched models, and
transformers versions outside the tested range.

Beside other libraries: transformers' classes and functions are kept when this module is
imported, modules are checked against them, and the patched forwards call the kept
functions (``apply_rotary_pos_emb`` where the rotary op is not chosen, so the attention is
patched on every route), so a later rebinding of a modeling module's names changes no
patched model.

The patched model is for inference: the fused weights are buffers the parameters are views
of, so load weights before `apply` (in-place loads after it are seen; parameters replaced
by new tensors are not). A forward that records gradients uses the separate projections.
A model on the meta device may be patched before ``to_empty`` and the weight load: it
takes the unfused routes, and its rotary cache is built on the first forward.

Mixture of experts: `apply_moe(model)` patches the sparse MoE blocks of Qwen3-MoE,
Qwen2-MoE and Mixtral models (router through ``topk_softmax``, experts through ``fused_experts`` on
transformers' fused expert weights); see `opcore.integrations.transformers._moe`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import torch.nn as nn
import transformers as _hf

from opcore.integrations.transformers import _versions
from opcore.integrations.transformers._arch import ARCHES, Arch, arch_of
from opcore.integrations.transformers._moe import MOE_MODEL_TYPES, MoePatch, apply_moe
from opcore.integrations.transformers._patch import (
    OPS,
    ROOT_ATTR,
    Patch,
    UnsupportedModelError,
    commit,
    plan,
)

__all__ = [
    "MOE_MODEL_TYPES",
    "OPS",
    "SUPPORTED_MODEL_TYPES",
    "TESTED_TRANSFORMERS",
    "Patch",
    "MoePatch",
    "UnsupportedModelError",
    "apply",
    "apply_moe",
    "apply_to_llama",
    "apply_to_mixtral",
    "apply_to_mistral",
    "apply_to_qwen2",
    "apply_to_qwen2_moe",
    "apply_to_qwen3",
    "apply_to_qwen3_moe",
    "is_patched",
    "patched",
    "revert",
    "revert_classes",
]

SUPPORTED_MODEL_TYPES = tuple(ARCHES)
TESTED_TRANSFORMERS = _versions.TESTED_RANGE
OpsArg = str | Iterable[str] | None


def _transformers() -> Any:
    """The transformers module as ``import transformers`` gives it now. Its lazy module
    replaces its own ``sys.modules`` entry when a modeling module is first imported (5.x),
    which this package does at import (`_arch.keep_originals`), so the object bound above
    is not the one users see."""
    return sys.modules.get("transformers", _hf)


def _check_version(check_version: bool) -> None:
    if check_version and (why := _versions.check(_transformers().__version__)):
        raise UnsupportedModelError(f"opcore.integrations.transformers: {why}")


def _arch(model: nn.Module, only: str | None = None) -> Arch:
    config = getattr(model, "config", None)
    arch = arch_of(config)
    name = type(model).__name__
    if not isinstance(model, _transformers().PreTrainedModel) or arch is None:
        mt = getattr(config, "model_type", None)
        raise UnsupportedModelError(
            f"opcore.integrations.transformers: {name} (model_type {mt!r}) is not supported; "
            f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if only is not None and arch.model_type != only:
        raise UnsupportedModelError(
            f"opcore.integrations.transformers: {name} is a {arch.model_type} model, not {only}"
        )
    return arch


def apply(model: nn.Module, *, ops: OpsArg = None, check_version: bool = True) -> Patch:
    """Patch a loaded Llama / Mistral / Qwen2 / Qwen3 ``model`` in place and return the
    `Patch` (``.routes``, ``.revert()``; also a context manager).

    ``ops``: the opcore ops to use (names from `OPS`; default: all that apply to the
    model). Everything is checked before anything changes: on any unsupported class or
    config option `UnsupportedModelError` lists every reason and the model is untouched."""
    _check_version(check_version)
    arch = _arch(model)
    if is_patched(model):
        raise UnsupportedModelError(
            "opcore.integrations.transformers: the model is already patched; revert it first"
        )
    result = plan(model, arch, ops)
    if isinstance(result, list):
        raise UnsupportedModelError(
            f"opcore.integrations.transformers: cannot patch {type(model).__name__} "
            f"({arch.model_type}); nothing was changed:\n  - " + "\n  - ".join(result)
        )
    return commit(model, result)


def is_patched(model: nn.Module) -> bool:
    return ROOT_ATTR in model.__dict__


def revert(model: nn.Module) -> None:
    """Undo `apply` on ``model`` (an error if it is not patched)."""
    patch = model.__dict__.get(ROOT_ATTR)
    if patch is None:
        raise ValueError(f"opcore.integrations.transformers: {type(model).__name__} is not patched")
    patch.revert()


@contextlib.contextmanager
def patched(model: nn.Module, *, ops: OpsArg = None, check_version: bool = True) -> Iterator[Patch]:
    """``with patched(model) as p:`` runs the block on the patched model, then reverts."""
    patch = apply(model, ops=ops, check_version=check_version)
    try:
        yield patch
    finally:
        if patch.active:
            patch.revert()


# ----------------------------------------------------------------- class level
_LOADERS = ("from_pretrained", "_from_config")
_CLASS_PATCHES: dict[str, dict[str, object]] = {}  # model_type -> loader -> original (or None)


def _apply_to(
    model_type: str, model: nn.Module | None, ops: OpsArg, check_version: bool
) -> Patch | None:
    _check_version(check_version)
    if model is not None:
        _arch(model, model_type)
        return apply(model, ops=ops, check_version=False)
    if model_type in _CLASS_PATCHES:
        raise UnsupportedModelError(
            f"opcore.integrations.transformers: {model_type} classes are already patched"
        )
    base = ARCHES[model_type].cls("PreTrainedModel")
    saved = {}
    for loader in _LOADERS:
        original = base.__dict__.get(loader)
        saved[loader] = original
        setattr(base, loader, classmethod(_patching_loader(getattr(base, loader).__func__, ops)))
    _CLASS_PATCHES[model_type] = saved
    return None


def _patching_loader(load, ops):
    @functools.wraps(load)
    def loader(cls, *args, **kwargs):
        model = load(cls, *args, **kwargs)
        apply(model, ops=ops, check_version=False)
        return model

    return loader


def revert_classes(model_type: str | None = None) -> None:
    """Undo the class-level patch of ``model_type`` (default: all). Models already loaded
    stay patched (revert them with `revert`)."""
    for mt in [model_type] if model_type else list(_CLASS_PATCHES):
        saved = _CLASS_PATCHES.pop(mt, None)
        if saved is None:
            continue
        base = ARCHES[mt].cls("PreTrainedModel")
        for loader, original in saved.items():
            if original is None:
                delattr(base, loader)
            else:
                setattr(base, loader, original)


def _helper(model_type: str):
    def apply_to(
        model: nn.Module | None = None, *, ops: OpsArg = None, check_version: bool = True
    ) -> Patch | None:
        return _apply_to(model_type, model, ops, check_version)

    apply_to.__name__ = apply_to.__qualname__ = f"apply_to_{model_type}"
    apply_to.__doc__ = (
        f"With ``model``: `apply` to a loaded {model_type} model (refusing any other). "
        f"Without: patch the {model_type} classes so that every model ``from_pretrained`` / "
        "``from_config`` returns is patched after loading, until `revert_classes`."
    )
    return apply_to


apply_to_llama = _helper("llama")
apply_to_mistral = _helper("mistral")
apply_to_qwen2 = _helper("qwen2")
apply_to_qwen3 = _helper("qwen3")
apply_to_qwen2_moe = _helper("qwen2_moe")
apply_to_qwen3_moe = _helper("qwen3_moe")
apply_to_mixtral = _helper("mixtral")
