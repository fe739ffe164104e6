"""The `ipex` provider: ops that intel-extension-for-pytorch implements for the CPU.

Registered only when IPEX imports (`REGISTERED` says whether it did, `IMPORT_ERROR` why
not); otherwise this module registers nothing. The kernels are IPEX's documented
``intel_extension_for_pytorch.llm.functional`` API:

=====================  ================================================================
op                     IPEX call
=====================  ================================================================
rms_norm               ``rms_norm(x, weight, eps)``
fused_add_rms_norm     ``add_rms_norm(residual, x, weight, None, eps, add_back=True)``:
                       writes ``x + residual`` into ``residual`` (in place), returns the
                       normalised sum
silu_and_mul           ``silu_mul(x[..., :d], x[..., d:])``
gelu_and_mul           ``gelu_mul(x[..., :d], x[..., d:], approximate=...)``
rotary_embedding       ``rotary_embedding(q, k, sin, cos, head_size, is_neox)`` with cos/sin
                       gathered from the cache rows at ``positions``
=====================  ================================================================

Each ``supports_args`` accepts what those calls handle (checked against the native ops in
a torch 2.8 + IPEX 2.8 venv by ``plugins/cpu/scripts/verify_ipex.sh``): CPU tensors of
fp32/bf16/fp16 in any layout (strided inputs are made dense first, so the choice never
depends on strides, which compiled graphs do not always preserve); a weight of ``x``'s
dtype (IPEX has no weight-less RMSNorm) and no ``variance_size``; rotary on the whole head
(IPEX has no partial rotary here) with a key, and not bf16 GPT-J style unless
``head_size % 32 == 0``
(a wrong result in IPEX 2.8, found by the conformance suite). Everything else goes to the
next provider.
"""

from __future__ import annotations

import torch

from opcore.ir import ops

PROVIDER = "ipex"
OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "gelu_and_mul", "rotary_embedding")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

try:
    import intel_extension_for_pytorch.llm.functional as _ipex_f
except Exception as exc:  # not installed, or built for another torch: not registered
    _ipex_f = None
    IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    IMPORT_ERROR = None

REGISTERED = _ipex_f is not None


def _cpu(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype in DTYPES


def _norm_args_ok(x, weight, variance_size) -> bool:
    return (
        _cpu(x)
        and x.dim() >= 2
        and variance_size is None
        and _cpu(weight)
        and weight.dtype == x.dtype
        and weight.dim() == 1
    )


def supports_rms_norm(x, weight, epsilon, variance_size=None) -> bool:
    return bool(_norm_args_ok(x, weight, variance_size))


def supports_fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    return bool(
        _norm_args_ok(x, weight, variance_size)
        and _cpu(x_residual)
        and x_residual.dtype == x.dtype
        and x_residual.shape == x.shape
    )


def _gated_ok(x) -> bool:
    return _cpu(x) and x.dim() >= 1 and x.shape[-1] % 2 == 0 and x.shape[-1] > 0


def supports_silu_and_mul(x) -> bool:
    return bool(_gated_ok(x))


def supports_gelu_and_mul(x, approximate="none") -> bool:
    return bool(_gated_ok(x) and approximate in ("none", "tanh"))


def supports_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox) -> bool:
    return bool(
        _cpu(query)
        and _cpu(key)
        and key.dtype == query.dtype
        and isinstance(cos_sin_cache, torch.Tensor)
        and cos_sin_cache.device.type == "cpu"
        and cos_sin_cache.dim() == 2
        and cos_sin_cache.shape[-1] == head_size
        and query.shape[-1] % head_size == 0
        and key.shape[-1] % head_size == 0
        and positions.dim() == 1
        and query.shape[0] == positions.shape[0]
        and key.shape[0] == positions.shape[0]
        # IPEX 2.8's CPU kernel returns garbage (NaN, 1e38) for bf16 GPT-J-style rotary
        # when head_size is not a multiple of 32 (seen at 40, 48, 56, 72, 80, 88, 112, 120,
        # 136, 144, 176, 208); fp32/fp16 and NeoX style are correct at every size tried.
        and (is_neox or query.dtype != torch.bfloat16 or head_size % 32 == 0)
    )


if REGISTERED:

    @ops.rms_norm.register_impl(PROVIDER, supports_args=supports_rms_norm)
    def rms_norm(x, weight, epsilon, variance_size=None):
        return _ipex_f.rms_norm(x.contiguous(), weight.contiguous(), float(epsilon))

    @ops.fused_add_rms_norm.register_impl(
        PROVIDER, supports_args=supports_fused_add_rms_norm, inplace=True
    )
    def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
        # IPEX stores x + residual into its `residual` argument: the op's second output
        # (the caller's x_residual itself when it is contiguous, else a dense copy).
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
        # Views of the caller's tensors when they are dense (IPEX rotates them in place),
        # dense copies otherwise.
        q = query.contiguous().view(n, -1, head_size)
        k = key.contiguous().view(n, -1, head_size)
        q_out, k_out = _ipex_f.rotary_embedding(q, k, sin, cos, head_size, bool(is_neox))
        return q_out.reshape(query.shape), k_out.reshape(key.shape)
