"""Provider ``ipex`` for XPU tensors: intel-extension-for-pytorch's XPU kernels.

Registered only when IPEX imports (`REGISTERED`; `IMPORT_ERROR` keeps why not). Calls
IPEX's documented ``intel_extension_for_pytorch.llm.functional`` API, which dispatches on
the tensor's device type, so the same calls reach IPEX's SYCL kernels for ``xpu`` tensors:
``rms_norm(x, w, eps)``, ``add_rms_norm(residual, x, w, None, eps, True)`` (writes the sum
into ``residual``), ``silu_mul`` / ``gelu_mul`` on the two halves, and
``rotary_embedding(q, k, sin, cos, rotary_dim, rotary_half)``.

These calls and their argument limits are the ones verified for IPEX's *CPU* kernels (see
plugins/cpu/reports/ipex.md); the XPU kernels have never run here (no Intel GPU). Each
``supports_args`` is therefore the same conservative set: fp32/bf16/fp16 XPU tensors
(strided inputs made dense first, so layout never decides), a weight of ``x``'s dtype and
no ``variance_size``, whole-head rotary with a key.
"""

from __future__ import annotations

import torch

from opcore.ir import ops

PROVIDER = "ipex"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

try:
    import intel_extension_for_pytorch.llm.functional as _ipex_f
except Exception as exc:  # not installed or not an XPU build: not registered
    _ipex_f = None
    IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    IMPORT_ERROR = None

REGISTERED = _ipex_f is not None


def _xpu(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "xpu" and t.dtype in DTYPES


def _norm_ok(x, weight, variance_size) -> bool:
    return (
        _xpu(x)
        and variance_size is None
        and _xpu(weight)
        and weight.dtype == x.dtype
        and weight.dim() == 1
    )


def supports_rms_norm(x, weight, epsilon, variance_size=None) -> bool:
    return bool(_norm_ok(x, weight, variance_size))


def supports_fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    return bool(
        _norm_ok(x, weight, variance_size)
        and _xpu(x_residual)
        and x_residual.dtype == x.dtype
        and x_residual.shape == x.shape
    )


def supports_silu_and_mul(x) -> bool:
    return bool(_xpu(x) and x.shape[-1] % 2 == 0 and x.shape[-1] > 0)


def supports_gelu_and_mul(x, approximate="none") -> bool:
    return bool(supports_silu_and_mul(x) and approximate in ("none", "tanh"))


def supports_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox) -> bool:
    return bool(
        _xpu(query)
        and _xpu(key)
        and key.dtype == query.dtype
        and cos_sin_cache.dim() == 2
        and cos_sin_cache.shape[-1] == head_size
        and positions.dim() == 1
        and query.shape[0] == positions.shape[0]
        and key.shape[0] == positions.shape[0]
        and query.shape[-1] % head_size == 0
        and key.shape[-1] % head_size == 0
    )


if REGISTERED:

    @ops.rms_norm.register_impl(PROVIDER, supports_args=supports_rms_norm)
    def rms_norm(x, weight, epsilon, variance_size=None):
        return _ipex_f.rms_norm(x.contiguous(), weight.contiguous(), float(epsilon))

    @ops.fused_add_rms_norm.register_impl(
        PROVIDER, supports_args=supports_fused_add_rms_norm, inplace=True
    )
    def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
        residual = x_residual.contiguous()
        out = _ipex_f.add_rms_norm(
            residual, x.contiguous(), weight.contiguous(), None, float(epsilon), True
        )
        return out, residual

    @ops.silu_and_mul.register_impl(PROVIDER, supports_args=supports_silu_and_mul)
    def silu_and_mul(x):
        x = x.contiguous()
        d = x.shape[-1] // 2
        return _ipex_f.silu_mul(x[..., :d], x[..., d:])

    @ops.gelu_and_mul.register_impl(PROVIDER, supports_args=supports_gelu_and_mul)
    def gelu_and_mul(x, approximate="none"):
        x = x.contiguous()
        d = x.shape[-1] // 2
        return _ipex_f.gelu_mul(x[..., :d], x[..., d:], approximate=approximate)

    @ops.rotary_embedding.register_impl(
        PROVIDER, supports_args=supports_rotary_embedding, inplace=True
    )
    def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
        n = positions.shape[0]
        cs = cos_sin_cache.index_select(0, positions).to(torch.float32)
        half = cs.shape[-1] // 2
        cos, sin = cs[:, :half].contiguous(), cs[:, half:].contiguous()
        q, k = _ipex_f.rotary_embedding(
            query.contiguous().view(n, -1, head_size),
            key.contiguous().view(n, -1, head_size),
            sin,
            cos,
            head_size,
            bool(is_neox),
        )
        return q.reshape(query.shape), k.reshape(key.shape)
