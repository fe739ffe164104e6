"""Registers the ``triton`` provider on the `opcore.ir` ops, with each op's ``supports_args``.

Every ``supports_*`` below has the op's exact parameters and answers from metadata alone
(dtype, device type, shape, strides, Python scalars), so it also runs on fake tensors.
"""

from __future__ import annotations

import inspect

import torch

from opcore.ir import ops
from opcore.kernels.triton import HAS_TRITON, PROVIDER
from opcore.kernels.triton._support import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    driven_device_types,
    head_layout,
    on_devices,
    row_stride,
)

if HAS_TRITON:
    from opcore.kernels.triton import activation, norm, qk_norm_rope, rotary

    INTERPRETED = type(norm._rms_norm_kernel).__name__ == "InterpretedFunction"
else:
    INTERPRETED = False

DEVICE_TYPES = driven_device_types(INTERPRETED) if HAS_TRITON else frozenset()


def _is_float_tensor(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in FLOAT_DTYPES


def _is_scalar(v) -> bool:
    return isinstance(v, (float, int)) and not isinstance(v, bool)


def _weight_ok(w, n: int) -> bool:
    return w is None or (
        _is_float_tensor(w) and w.dim() == 1 and w.shape[0] == n and (n == 1 or w.stride(0) == 1)
    )


def _rows_disjoint(t: torch.Tensor) -> bool:
    """Rows of ``t`` do not overlap (required where a kernel writes ``t`` in place)."""
    n = t.shape[-1]
    rows = t.numel() // n if n else 0
    s = row_stride(t)
    return s is not None and (rows <= 1 or s >= n)


def _heads_disjoint(t: torch.Tensor, n_tokens: int, head_size: int) -> bool:
    lay = head_layout(t, n_tokens, head_size)
    if lay is None:
        return False
    tok, head, heads = lay
    return (heads <= 1 or head >= head_size) and (n_tokens <= 1 or tok >= heads * head)


# --------------------------------------------------------------------------- norms
def supports_rms_norm(x, weight, epsilon, variance_size=None) -> bool:
    if not (_is_float_tensor(x) and x.dim() >= 1 and x.shape[-1] > 0 and _is_scalar(epsilon)):
        return False
    n = x.shape[-1]
    if variance_size is not None and not (
        isinstance(variance_size, int) and not isinstance(variance_size, bool) and 0 < variance_size <= n
    ):
        return False
    return on_devices(DEVICE_TYPES, x, weight) and _weight_ok(weight, n) and row_stride(x) is not None


def supports_fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    # The provider writes in place (the default overload clones first), so rows must be disjoint.
    return (
        supports_rms_norm(x, weight, epsilon, variance_size)
        and _is_float_tensor(x_residual)
        and x_residual.dtype == x.dtype
        and x_residual.shape == x.shape
        and on_devices(DEVICE_TYPES, x, x_residual)
        and _rows_disjoint(x)
        and _rows_disjoint(x_residual)
    )


# --------------------------------------------------------------------------- activations
def supports_silu_and_mul(x) -> bool:
    return (
        _is_float_tensor(x)
        and x.dim() >= 1
        and x.shape[-1] % 2 == 0
        and on_devices(DEVICE_TYPES, x)
        and row_stride(x) is not None
    )


def supports_gelu_and_mul(x, approximate="none") -> bool:
    return approximate in ("none", "tanh") and supports_silu_and_mul(x)


# --------------------------------------------------------------------------- rotary
def _cache_ok(cache, head_size) -> bool:
    return (
        _is_float_tensor(cache)
        and cache.dim() == 2
        and cache.shape[-1] % 2 == 0
        and 0 < cache.shape[-1] <= head_size
        and cache.stride(-1) == 1
    )


def _head_size_ok(head_size) -> bool:
    return isinstance(head_size, int) and not isinstance(head_size, bool) and head_size > 0


def supports_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox) -> bool:
    if not (
        isinstance(positions, torch.Tensor)
        and positions.dtype in INDEX_DTYPES
        and _is_float_tensor(query)
        and (key is None or (_is_float_tensor(key) and key.dtype == query.dtype))
        and _head_size_ok(head_size)
        and isinstance(is_neox, bool)
        and _cache_ok(cos_sin_cache, head_size)
        and on_devices(DEVICE_TYPES, positions, query, key, cos_sin_cache)
    ):
        return False
    n = positions.numel()
    # In place (the default overload clones first): heads must not overlap.
    return _heads_disjoint(query, n, head_size) and (key is None or _heads_disjoint(key, n, head_size))


def supports_split_qkv_rmsnorm_rope(
    qkv, q_weight, k_weight, epsilon, positions, cos_sin_cache, num_heads, num_kv_heads, head_size, is_neox
) -> bool:
    if not (
        _is_float_tensor(qkv)
        and qkv.dim() >= 1
        and isinstance(positions, torch.Tensor)
        and positions.dtype in INDEX_DTYPES
        and _head_size_ok(head_size)
        and _head_size_ok(num_heads)
        and _head_size_ok(num_kv_heads)
        and isinstance(is_neox, bool)
        and _is_scalar(epsilon)
        and _cache_ok(cos_sin_cache, head_size)
        and (q_weight is None) == (k_weight is None)
        and _weight_ok(q_weight, head_size)
        and _weight_ok(k_weight, head_size)
        and on_devices(DEVICE_TYPES, qkv, q_weight, k_weight, positions, cos_sin_cache)
    ):
        return False
    tokens = qkv.numel() // qkv.shape[-1] if qkv.shape[-1] else 0
    return (
        qkv.shape[-1] == (num_heads + 2 * num_kv_heads) * head_size
        and tokens == positions.numel()
        and row_stride(qkv) is not None
    )


# --------------------------------------------------------------------------- registration
def _unavailable(op_name: str):
    def fail(*args, **kwargs):
        raise RuntimeError(
            f"op {op_name!r}: provider 'triton' is not supported here (triton does not import)"
        )

    fail.__signature__ = inspect.signature(getattr(ops, op_name).native)
    return fail


def _register(op_name, impl, supports, *, inplace=False, functional=None):
    op = getattr(ops, op_name)
    if PROVIDER in op.impls:  # idempotent: a re-import (or importlib.reload) registers nothing new
        return
    fn = impl if HAS_TRITON else _unavailable(op_name)
    kwargs = {"supported": HAS_TRITON, "supports_args": supports, "inplace": inplace}
    # An out-of-place kernel for the default overload, where the op registry takes one;
    # otherwise the registry clones the activations before calling the in-place kernel.
    if functional is not None and HAS_TRITON and "functional" in inspect.signature(op.register_impl).parameters:
        kwargs["functional"] = functional
    op.register_impl(PROVIDER, **kwargs)(fn)


def register_all() -> None:
    """Register provider ``triton`` on the six ops (idempotent)."""
    k = HAS_TRITON
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


register_all()
