"""What `opcore bench` times for a case: every registered provider that accepts the
arguments, plus baselines (native eager, torch.compile of the native function, F.rms_norm,
Liger and FlagGems kernels when importable, and for the fused split the unfused chain of
providers).

Each entry is a zero-argument callable over the case's prepared tensors; anything not
available says why in the skip map instead of disappearing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from opcore.bench.cases import Case

Fn = Callable[[], object]

# The peers timed next to the registered providers, and the ops each applies to (None: all).
BASELINES: dict[str, tuple[str, ...] | None] = {
    "compile": None,
    "F.rms_norm": ("rms_norm",),
    "liger": (
        "rms_norm",
        "fused_add_rms_norm",
        "silu_and_mul",
        "gelu_and_mul",
        "rotary_embedding",
    ),
    "flaggems": (
        "rms_norm",
        "fused_add_rms_norm",
        "silu_and_mul",
        "gelu_and_mul",
        "rotary_embedding",
    ),
    "triton-unfused": ("split_qkv_rmsnorm_rope",),
}


def known_names(op_names: tuple[str, ...] | list[str]) -> list[str]:
    """Every name ``providers(..., wanted)`` can time for some op of ``op_names``: the
    providers registered for them (supported here or not) and the peers that apply."""
    from opcore.ir import ops

    names: dict[str, None] = {}
    for op_name in op_names:
        names.update(dict.fromkeys(getattr(ops, op_name).impls))
    for peer, applies in BASELINES.items():
        if applies is None or any(o in applies for o in op_names):
            names[peer] = None
    return list(names)


@functools.cache
def _compiled(op_name: str):
    import torch._dynamo

    cfg = torch._dynamo.config
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, knob):
            setattr(cfg, knob, max(getattr(cfg, knob), 256))
    from opcore.ir import ops

    return torch.compile(getattr(ops, op_name).impls["native"].impl_fn, dynamic=False)


def providers(case: Case, wanted: set[str] | None = None) -> tuple[dict[str, Fn], dict[str, str]]:
    """``({name: fn}, {name: why skipped})`` for ``case``; ``wanted`` filters by name."""
    from opcore.ir import ops

    op = getattr(ops, case.op)
    args = case.args
    fns: dict[str, Fn] = {}
    skipped: dict[str, str] = {}

    def want(name: str) -> bool:
        return wanted is None or name in wanted

    for name, impl in op.impls.items():
        if not want(name):
            continue
        if not impl.supported:
            skipped[name] = "provider not supported here"
            continue
        if impl.supports_args is not None and not impl.supports_args(*args):
            skipped[name] = "supports_args rejects these arguments"
            continue
        # In-place providers are timed in place (the maybe_inplace path layers use).
        fn = impl.impl_fn
        fns[name] = functools.partial(fn, *args)

    if want("compile"):
        compiled = _compiled(case.op)
        fns["compile"] = functools.partial(compiled, *args)

    if case.op == "rms_norm" and want("F.rms_norm"):
        x, w, eps = args
        fns["F.rms_norm"] = functools.partial(
            torch.nn.functional.rms_norm, x, (x.shape[-1],), w, eps
        )

    if want("liger"):
        fn, why = _liger(case)
        if fn is None:
            skipped["liger"] = why
        else:
            fns["liger"] = fn

    if want("flaggems"):
        fn, why = _flaggems(case)
        if fn is None:
            skipped["flaggems"] = why
        else:
            fns["flaggems"] = fn

    if case.op == "split_qkv_rmsnorm_rope" and want("triton-unfused"):
        fn, why = _unfused_split(case)
        if fn is None:
            skipped["triton-unfused"] = why
        else:
            fns["triton-unfused"] = fn
    return fns, skipped


def _unfused_split(case: Case) -> tuple[Fn | None, str]:
    """split -> rms_norm(q) -> rms_norm(k) -> rotary (in place) -> v copy, each through the
    ``triton`` provider: the chain the fused kernel replaces."""
    from opcore.ir import ops

    needed = ("rms_norm", "rotary_embedding")
    for name in needed:
        impl = getattr(ops, name).impls.get("triton")
        if impl is None or not impl.supported:
            return None, f"provider 'triton' of {name} is not available"
    norm = ops.rms_norm.impls["triton"].impl_fn
    rope = ops.rotary_embedding.impls["triton"].impl_fn
    qkv, qw, kw, eps, positions, cache, hq, hkv, d, neox = case.args
    n = positions.numel()

    def chain():
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        qn = norm(q.reshape(n * hq, d), qw, eps)  # per-head rows: reshape copies the slice
        kn = norm(k.reshape(n * hkv, d), kw, eps)
        qr, kr = rope(positions, qn.view(n, hq * d), kn.view(n, hkv * d), d, cache, neox)
        return qr, kr, v.contiguous()

    return chain, ""


def _liger(case: Case) -> tuple[Fn | None, str]:
    try:
        import liger_kernel  # noqa: F401
    except Exception as exc:
        return None, f"liger_kernel not importable ({type(exc).__name__})"
    if case.args and isinstance(case.args[0], torch.Tensor) and case.args[0].device.type == "cpu":
        return None, "Liger's Triton kernels need an accelerator, not the host cpu"
    try:
        if case.op == "rms_norm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            x, w, eps = case.args
            return functools.partial(LigerRMSNormFunction.apply, x, w, eps, 0.0, "llama", False), ""
        if case.op == "fused_add_rms_norm":
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

            x, r, w, eps = case.args
            return functools.partial(
                LigerFusedAddRMSNormFunction.apply, x, r, w, eps, 0.0, "llama", True
            ), ""
        if case.op == "silu_and_mul":
            from liger_kernel.ops import swiglu

            if hasattr(swiglu, "LigerFusedGateUpSiLUMulFunction"):
                return functools.partial(
                    swiglu.LigerFusedGateUpSiLUMulFunction.apply, case.args[0]
                ), ""
            return functools.partial(
                swiglu.LigerSiLUMulFunction.apply, case.extras["gate"], case.extras["up"]
            ), ""
        if case.op == "gelu_and_mul":
            from liger_kernel.ops.geglu import LigerGELUMulFunction  # tanh approximation

            return functools.partial(
                LigerGELUMulFunction.apply, case.extras["gate"], case.extras["up"]
            ), ""
        if case.op == "rotary_embedding":
            from liger_kernel.ops.rope import LigerRopeFunction

            e = case.extras
            return functools.partial(
                LigerRopeFunction.apply, e["q4"], e["k4"], e["cos"], e["sin"]
            ), ""
    except Exception as exc:
        return None, f"Liger kernel for {case.op} unavailable: {type(exc).__name__}: {exc}"
    return None, f"Liger has no {case.op} kernel"


def _flaggems(case: Case) -> tuple[Fn | None, str]:
    """FlagGems' kernel for ``case.op`` over the same tensors (its fused norms and rotary
    work in place, as opcore's in-place providers are timed; the activations take the gate
    and the up halves apart, prepared outside the timed region)."""
    if case.args and isinstance(case.args[0], torch.Tensor) and case.args[0].device.type == "cpu":
        return None, "FlagGems' Triton kernels need an accelerator, not the host cpu"
    try:
        import flag_gems  # noqa: F401
    except Exception as exc:
        return None, f"flag_gems not importable ({type(exc).__name__})"
    try:
        if case.op == "rms_norm":
            from flag_gems.ops.rms_norm import rms_norm

            x, w, eps = case.args
            return functools.partial(rms_norm, x, [x.shape[-1]], w, eps), ""
        if case.op == "fused_add_rms_norm":
            from flag_gems.fused import fused_add_rms_norm

            x, r, w, eps = case.args
            return functools.partial(fused_add_rms_norm, x, r, [x.shape[-1]], w, eps), ""
        if case.op == "silu_and_mul":
            from flag_gems.fused import silu_and_mul

            return functools.partial(silu_and_mul, case.extras["gate"], case.extras["up"]), ""
        if case.op == "gelu_and_mul":
            from flag_gems.fused import gelu_and_mul

            gate, up = case.extras["gate"], case.extras["up"]
            return functools.partial(gelu_and_mul, gate, up, case.args[1]), ""
        if case.op == "rotary_embedding":
            from flag_gems.fused import apply_rotary_pos_emb

            positions, q, k, d, cache, _neox = case.args
            # (tokens, heads, head size) views of the same rows; cos and sin halves of the
            # cache with a unit last stride, as the kernel requires
            cos, sin = cache[:, : d // 2], cache[:, d // 2 :]
            q3, k3 = q.view(q.shape[0], -1, d), k.view(k.shape[0], -1, d)
            return functools.partial(
                apply_rotary_pos_emb, q3, k3, cos, sin, positions, False, True
            ), ""
    except Exception as exc:
        return None, f"FlagGems kernel for {case.op} unavailable: {type(exc).__name__}: {exc}"
    return None, f"FlagGems has no {case.op} kernel"
