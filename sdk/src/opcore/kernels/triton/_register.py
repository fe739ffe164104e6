"""Registers the ``triton`` provider on the `opcore.ir` ops, with each op's ``supports_args``.

Every ``supports_*`` below has the op's exact parameters and answers from metadata alone
(dtype, device type, shape, strides, Python scalars), so it also runs on fake tensors.
Under dynamic shapes sizes are SymInts and their comparisons SymBools: each answer passes
through ``bool()``, which decides from the size hint and guards the compiled graph on it.
"""

from __future__ import annotations

import inspect
import sys

import torch

from opcore.ir import ops
from opcore.kernels import FP8_OPS, MOE_OPS
from opcore.kernels.triton import HAS_TRITON, PROVIDER
from opcore.kernels.triton._support import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    device_check,
    driven_device_types,
    head_layout,
    row_layout,
)

INTERPRETED: bool  # the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1)
IDENTITY_SOURCES: tuple = ()  # modules in every triton provider's identity hash
if HAS_TRITON:
    from opcore.kernels.triton import (
        _bound,
        _launch,
        _support,
        activation,
        moe,
        norm,
        qk_norm_rope,
        quant,
        rotary,
        spaces,
    )

    INTERPRETED = type(norm._rms_norm_kernel).__name__ == "InterpretedFunction"
    IDENTITY_SOURCES = (_launch, _support, spaces)
else:
    INTERPRETED = False

DEVICE_TYPES: frozenset[str] = driven_device_types(INTERPRETED) if HAS_TRITON else frozenset()
# These checks run on every eager dispatch: each reads a tensor's metadata once.
_on_device = device_check(DEVICE_TYPES)
_Tensor = torch.Tensor


def _float(t) -> bool:
    return isinstance(t, _Tensor) and t.dtype in FLOAT_DTYPES


def _scalar(v) -> bool:
    return isinstance(v, (float, int)) and not isinstance(v, bool)


def _pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _weight_ok(w, n: int) -> bool:
    if w is None:
        return True
    if not _float(w):
        return False
    shape = w.shape
    return len(shape) == 1 and shape[0] == n and (n == 1 or w.stride(0) == 1)


def _heads_disjoint(lay) -> bool:
    """Heads of a `head_layout` do not overlap one another (in-place writes need this)."""
    tok, head, heads, n_tokens, head_size = lay
    return (heads <= 1 or head >= head_size) and (n_tokens <= 1 or tok >= heads * head)


# --------------------------------------------------------------------------- norms
def supports_rms_norm(x, weight, epsilon, variance_size=None) -> bool:
    if not (_float(x) and _scalar(epsilon) and _on_device(x, weight)):
        return False
    lay = row_layout(x)
    if lay is None or lay[0] == 0:
        return False
    n = lay[0]
    if variance_size is not None and not (_pos_int(variance_size) and variance_size <= n):
        return False
    return bool(_weight_ok(weight, n))


def supports_fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    if not (
        _float(x)
        and _float(x_residual)
        and _scalar(epsilon)
        and x_residual.dtype == x.dtype
        and _on_device(x, x_residual, weight)
    ):
        return False
    lx, lr = row_layout(x), row_layout(x_residual)
    if lx is None or lr is None or lx[0] == 0 or x.shape != x_residual.shape:
        return False
    n, rows = lx[0], lx[1]
    if variance_size is not None and not (_pos_int(variance_size) and variance_size <= n):
        return False
    # The provider writes in place (the default overload clones first): rows must be disjoint.
    return bool(_weight_ok(weight, n) and (rows <= 1 or (lx[2] >= n and lr[2] >= n)))


# --------------------------------------------------------------------------- activations
def supports_silu_and_mul(x) -> bool:
    if not (_float(x) and _on_device(x)):
        return False
    lay = row_layout(x)
    return bool(lay is not None and lay[0] % 2 == 0)


def supports_gelu_and_mul(x, approximate="none") -> bool:
    return (approximate == "none" or approximate == "tanh") and supports_silu_and_mul(x)


# --------------------------------------------------------------------------- rotary
def _cache_ok(cache, head_size) -> bool:
    if not _float(cache):
        return False
    shape = cache.shape
    return (
        len(shape) == 2 and shape[1] % 2 == 0 and 0 < shape[1] <= head_size and cache.stride(1) == 1
    )


def _layout(t, n_tokens, head_size):
    lay = head_layout(t, n_tokens, head_size)
    return None if lay is None else (*lay, n_tokens, head_size)


def supports_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox) -> bool:
    if not (
        isinstance(positions, _Tensor)
        and positions.dtype in INDEX_DTYPES
        and _float(query)
        and (key is None or (_float(key) and key.dtype == query.dtype))
        and _pos_int(head_size)
        and isinstance(is_neox, bool)
        and _cache_ok(cos_sin_cache, head_size)
        and _on_device(positions, query, key, cos_sin_cache)
    ):
        return False
    n = positions.numel()
    # In place (the default overload clones first): heads must not overlap.
    lq = _layout(query, n, head_size)
    if lq is None or not _heads_disjoint(lq):
        return False
    if key is None:
        return True
    lk = _layout(key, n, head_size)
    return bool(lk is not None and _heads_disjoint(lk))


def supports_split_qkv_rmsnorm_rope(
    qkv,
    q_weight,
    k_weight,
    epsilon,
    positions,
    cos_sin_cache,
    num_heads,
    num_kv_heads,
    head_size,
    is_neox,
) -> bool:
    if not (
        _float(qkv)
        and isinstance(positions, _Tensor)
        and positions.dtype in INDEX_DTYPES
        and _pos_int(head_size)
        and _pos_int(num_heads)
        and _pos_int(num_kv_heads)
        and isinstance(is_neox, bool)
        and _scalar(epsilon)
        and (q_weight is None) == (k_weight is None)
        and _cache_ok(cos_sin_cache, head_size)
        and _weight_ok(q_weight, head_size)
        and _weight_ok(k_weight, head_size)
        and _on_device(qkv, q_weight, k_weight, positions, cos_sin_cache)
    ):
        return False
    lay = row_layout(qkv)
    return bool(
        lay is not None
        and lay[0] == (num_heads + 2 * num_kv_heads) * head_size
        and lay[1] == positions.numel()
    )


# --------------------------------------------------------------------------- fp8 quantization
# Where the platform does not declare the fp8 dtype (no fp8 conversions on the device) and
# under the interpreter, the kernels encode fp8 codes in integer arithmetic
# (`quant.codes_encoded`), so either fp8 dtype runs wherever the other kernels run.
def _scale_ok(s) -> bool:
    return isinstance(s, _Tensor) and s.dtype == torch.float32 and s.numel() == 1


def _rows_ok(x, n_even: bool = False) -> bool:
    lay = row_layout(x)
    return lay is not None and lay[0] > 0 and (not n_even or lay[0] % 2 == 0)


def supports_scaled_fp8_quant(x, scale) -> bool:
    return bool(_float(x) and _scale_ok(scale) and _on_device(x, scale) and _rows_ok(x))


def supports_dynamic_per_token_scaled_fp8_quant(x, scale_ub=None) -> bool:
    return bool(
        _float(x)
        and (scale_ub is None or _scale_ok(scale_ub))
        and _on_device(x, scale_ub)
        and _rows_ok(x)
    )


def _group_ok(group_size, width) -> bool:
    return _pos_int(group_size) and width % group_size == 0


def supports_per_token_group_quant_fp8(x, group_size=128, column_major_scales=False) -> bool:
    return bool(
        _float(x)
        and isinstance(column_major_scales, bool)
        and _on_device(x)
        and _rows_ok(x)
        and _group_ok(group_size, x.shape[-1])
    )


def _norm_ok(x, weight, epsilon, residual=None) -> bool:
    if not (_float(x) and _scalar(epsilon) and _rows_ok(x)):
        return False
    if residual is not None and not (
        _float(residual)
        and residual.dtype == x.dtype
        and residual.shape == x.shape
        and row_layout(residual) is not None
    ):
        return False
    return _weight_ok(weight, x.shape[-1])


def supports_rms_norm_static_fp8_quant(x, weight, epsilon, scale) -> bool:
    return bool(_norm_ok(x, weight, epsilon) and _scale_ok(scale) and _on_device(x, weight, scale))


def supports_fused_add_rms_norm_static_fp8_quant(x, residual, weight, epsilon, scale) -> bool:
    return bool(
        _norm_ok(x, weight, epsilon, residual)
        and _scale_ok(scale)
        and _on_device(x, residual, weight, scale)
    )


def supports_rms_norm_dynamic_per_token_quant(
    x, weight, epsilon, residual=None, scale_ub=None
) -> bool:
    return bool(
        _norm_ok(x, weight, epsilon, residual)
        and (scale_ub is None or _scale_ok(scale_ub))
        and _on_device(x, residual, weight, scale_ub)
    )


def supports_silu_and_mul_fp8_quant(x, scale) -> bool:
    return bool(
        _float(x) and _scale_ok(scale) and _on_device(x, scale) and _rows_ok(x, n_even=True)
    )


def supports_silu_and_mul_per_token_group_fp8_quant(x, group_size=128) -> bool:
    return bool(
        _float(x)
        and _on_device(x)
        and _rows_ok(x, n_even=True)
        and _group_ok(group_size, x.shape[-1] // 2)
    )


# --------------------------------------------------------------------------- mixture of experts
# The routing and align kernels hold a row of E experts in registers (`moe.MAX_EXPERTS`).
def _experts_ok(n) -> bool:
    return 0 < n <= 1024


def supports_topk_softmax(gating_output, topk, renormalize) -> bool:
    if not (_float(gating_output) and isinstance(renormalize, bool) and _on_device(gating_output)):
        return False
    shape = gating_output.shape
    return bool(len(shape) == 2 and _experts_ok(shape[1]) and _pos_int(topk) and topk <= shape[1])


def supports_grouped_topk(
    gating_output,
    topk,
    renormalize,
    num_expert_group,
    topk_group,
    scoring_func="softmax",
    routed_scaling_factor=1.0,
    e_score_correction_bias=None,
) -> bool:
    # With a bias the order is that of s + bias, where the kernel's fp32 exp/sigmoid (a few
    # ULPs off torch's) could swap near-tied experts: those calls run on the next provider.
    if e_score_correction_bias is not None or scoring_func not in ("softmax", "sigmoid"):
        return False
    if not (
        _scalar(routed_scaling_factor) and supports_topk_softmax(gating_output, 1, renormalize)
    ):
        return False
    experts = gating_output.shape[1]
    if not (_pos_int(num_expert_group) and num_expert_group <= 64 and _pos_int(topk_group)):
        return False
    return bool(
        experts % num_expert_group == 0
        and topk_group <= num_expert_group
        and _pos_int(topk)
        and topk <= topk_group * (experts // num_expert_group)
    )


def supports_fused_experts(
    hidden_states,
    w13,
    w2,
    topk_weights,
    topk_ids,
    activation="silu",
    apply_router_weight_on_input=False,
) -> bool:
    x = hidden_states
    if not (
        _float(x)
        and isinstance(w13, _Tensor)
        and isinstance(w2, _Tensor)
        and w13.dtype == x.dtype
        and w2.dtype == x.dtype
        and _float(topk_weights)
        and isinstance(topk_ids, _Tensor)
        and topk_ids.dtype in INDEX_DTYPES
        and activation in ("silu", "gelu")
        and isinstance(apply_router_weight_on_input, bool)
        and _on_device(x, w13, w2, topk_weights, topk_ids)
    ):
        return False
    if len(x.shape) != 2 or len(w13.shape) != 3 or len(w2.shape) != 3 or len(topk_ids.shape) != 2:
        return False
    tokens, hidden = x.shape
    experts, two_i = w13.shape[0], w13.shape[1]
    k = topk_ids.shape[1]
    return bool(
        _experts_ok(experts)
        and hidden > 0
        and two_i > 0
        and two_i % 2 == 0
        and w13.shape[2] == hidden
        and tuple(w2.shape) == (experts, hidden, two_i // 2)
        and topk_ids.shape[0] == tokens
        and tuple(topk_weights.shape) == (tokens, k)
        and 0 < k <= experts
        and (not apply_router_weight_on_input or k == 1)
        and tokens * k < 2**31 // 2  # pair indices are int32
    )


# --------------------------------------------------------------------------- registration
def _unavailable(op_name: str):
    def fail(*args, **kwargs):
        raise RuntimeError(
            f"op {op_name!r}: provider 'triton' is not supported here (triton does not import)"
        )

    # inspect.signature reads __signature__; mypy does not model attributes set on a function.
    fail.__signature__ = inspect.signature(getattr(ops, op_name).native)  # type: ignore[attr-defined]
    return fail


# Provider properties (docs/properties.md), checked by `opcore conformance` on the device.
# All: no atomics (deterministic), no host synchronization or allocation (capture_safe).
# The elementwise kernels compute each element by one fixed expression, so no launch
# configuration can change a row's bits (batch_invariant); the norms reduce a row in an
# order set by ROWS and num_warps, which follow the row count (provider
# "triton_batch_invariant" fixes them). On an H200 every claim below held
# (bench/results/2026-12-01-h200-properties); the norms' batch invariance also held on the
# rows checked, but is not claimed for the reason above.
_ELEMENTWISE = frozenset({"batch_invariant", "deterministic", "capture_safe"})
_REDUCING = frozenset({"deterministic", "capture_safe"})
PROPERTIES = {
    "rms_norm": _REDUCING,
    "fused_add_rms_norm": _REDUCING,
    "silu_and_mul": _ELEMENTWISE,
    "gelu_and_mul": _ELEMENTWISE,
    "rotary_embedding": _ELEMENTWISE,
    "split_qkv_rmsnorm_rope": _REDUCING,
    # fp8: a max is exact in any order, so per-token and per-group scales are
    # batch-invariant; the norms' sums are not (as above).
    "scaled_fp8_quant": _ELEMENTWISE,
    "dynamic_per_token_scaled_fp8_quant": _ELEMENTWISE,
    "per_token_group_quant_fp8": _ELEMENTWISE,
    "rms_norm_static_fp8_quant": _REDUCING,
    "fused_add_rms_norm_static_fp8_quant": _REDUCING,
    "rms_norm_dynamic_per_token_quant": _REDUCING,
    "silu_and_mul_fp8_quant": _ELEMENTWISE,
    "silu_and_mul_per_token_group_fp8_quant": _ELEMENTWISE,
    # Mixture of experts: no atomics and every sum in a fixed order (the slot sum of
    # fused_experts is its own kernel), no host synchronisation (the block-aligned sort runs
    # on the device; grids are sized for the worst routing). Not batch-invariant: the
    # routing kernels' row sums follow ROWS and num_warps, which follow the token count, and
    # a token's expert blocks (and BLOCK_M) change with the batch.
    "topk_softmax": _REDUCING,
    "grouped_topk": _REDUCING,
    "fused_experts": _REDUCING,
}


def kernel_sources(*fns) -> tuple:
    """`IDENTITY_SOURCES` and every module of this package whose functions (kernels, jit
    helpers) the modules of ``fns`` import: a helper shared between kernels decides what
    each of them computes, so editing it must change each one's identity (the fused QKV
    split calls rotary's rotation; a table measured before an edit there goes stale)."""
    package = __name__.rpartition(".")[0] + "."
    found = list(IDENTITY_SOURCES)
    for fn in fns:
        if fn is None:
            continue
        own = fn.__module__
        for value in vars(sys.modules[own]).values():
            target = getattr(value, "fn", value)  # a jit (or interpreted) kernel wraps its function
            name = getattr(target, "__module__", None) if inspect.isfunction(target) else None
            if name and name.startswith(package) and name != own:
                module = sys.modules[name]
                if module not in found:
                    found.append(module)
    return tuple(found)


def _register(op_name, impl, supports, *, inplace=False, functional=None):
    op = getattr(ops, op_name)
    if PROVIDER in op.impls:  # idempotent: a re-import (or importlib.reload) registers nothing new
        return
    fn = impl if HAS_TRITON else _unavailable(op_name)
    kwargs = {
        "supported": HAS_TRITON,
        "supports_args": supports,
        "inplace": inplace,
        "properties": PROPERTIES[op_name],
        # What a launch configuration means lives in these too: a tuning table keyed on
        # the identity must go stale when they change (docs/tuning.md).
        "identity_sources": kernel_sources(impl, functional),
    }
    # The out-of-place kernel serves the default overload, so it never pays for clones.
    if functional is not None and HAS_TRITON:
        kwargs["functional"] = functional
    # Calls of a signature seen before replay the recorded launches (docs/design.md#per-call-path).
    if HAS_TRITON:
        kwargs["bind"] = _bound.binder
    op.register_impl(PROVIDER, **kwargs)(fn)


def register_all() -> None:
    """Register provider ``triton`` on every op of `opcore.kernels.TRITON_OPS`, with its
    launch spaces (idempotent)."""
    k = HAS_TRITON
    if k:
        spaces.register_spaces(PROVIDER)
    _register("rms_norm", norm.rms_norm if k else None, supports_rms_norm)
    _register(
        "fused_add_rms_norm",
        norm.fused_add_rms_norm_inplace if k else None,
        supports_fused_add_rms_norm,
        inplace=True,
        functional=norm.fused_add_rms_norm if k else None,
    )
    _register("silu_and_mul", activation.silu_and_mul if k else None, supports_silu_and_mul)
    _register("gelu_and_mul", activation.gelu_and_mul if k else None, supports_gelu_and_mul)
    _register(
        "rotary_embedding",
        rotary.rotary_embedding_inplace if k else None,
        supports_rotary_embedding,
        inplace=True,
        functional=rotary.rotary_embedding if k else None,
    )
    _register(
        "split_qkv_rmsnorm_rope",
        qk_norm_rope.split_qkv_rmsnorm_rope if k else None,
        supports_split_qkv_rmsnorm_rope,
    )
    # The fp8 ops: each has its kernel in `quant` and its ``supports_<op>`` above, by name.
    for name in FP8_OPS:
        _register(name, getattr(quant, name) if k else None, globals()[f"supports_{name}"])
    for name in MOE_OPS:
        _register(name, getattr(moe, name) if k else None, globals()[f"supports_{name}"])


register_all()
