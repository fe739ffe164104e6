"""Provider ``npu``: the documented torch_npu kernels, for tensors on an Ascend NPU.

=====================  ==================================================================
op                     torch_npu call (signature as documented by torch_npu 2.13)
=====================  ==================================================================
rms_norm               ``npu_rms_norm(x, gamma, epsilon) -> (y, rstd)``; ``y`` is used
fused_add_rms_norm     ``npu_add_rms_norm(x1, x2, gamma, epsilon) -> (y, rstd, x1 + x2)``
silu_and_mul           ``npu_swiglu(x, dim=-1)``: ``silu(A) * B`` for ``A, B`` the halves
rotary_embedding       ``npu_mrope(positions, query, key, cos_sin_cache, head_size,
                       mrope_section=[0, 0, 0], rotary_mode="half" | "interleave")``:
                       plain rope mode, NeoX (``half``) or GPT-J (``interleave``)
=====================  ==================================================================

``supported`` is whether torch_npu imported (this module is imported by the Ascend
platform's ``import_ir_kernels``, so normally it has). Each ``supports_args`` keeps to the
documented limits: NPU tensors of fp32/fp16/bf16; a ``gamma`` of ``x``'s dtype (no
weight-less form) and no ``variance_size``; for ``npu_mrope`` 2-D ``[tokens, heads *
head_size]`` query and key (key required), 1-D positions, and ``rotary_dim`` a multiple
of 32 (fp16/bf16) or 16 (fp32). Anything else goes to the next provider (``native``).

None of these calls has run: the project has no Ascend NPU. They are written from
torch_npu's documentation (its ``_op_plugin_docs``) and vllm-ascend's usage.

The fp8 quantization ops (`opcore.ir.ops.scaled_fp8_quant` and siblings) get no provider
here (`FP8_QUANT_OPS` is empty): torch_npu's quantization kernels for Atlas A2/A3
(``npu_dynamic_quant``, ``npu_quantize``, ``npu_add_rms_norm_quant``) produce int8 or int4,
and ``npu_dynamic_mx_quant`` shares power-of-two scales per block of 32, neither the ops'
fp8 with float32 scales. They run ``native`` on an NPU.
"""

from __future__ import annotations

import torch

from opcore.ir import ops

PROVIDER = "npu"
# The fp8 quantization ops this provider serves: none (see the module docstring).
FP8_QUANT_OPS: tuple[str, ...] = ()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

try:
    import torch_npu
except Exception as exc:  # not installed, or no CANN runtime: registered unsupported
    torch_npu = None
    IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    IMPORT_ERROR = None

SUPPORTED = torch_npu is not None


def _npu(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "npu" and t.dtype in DTYPES


def _norm_ok(x, weight, variance_size) -> bool:
    return (
        _npu(x)
        and 2 <= x.dim() <= 8
        and variance_size is None
        and _npu(weight)
        and weight.dtype == x.dtype
        and weight.shape == (x.shape[-1],)
    )


def supports_rms_norm(x, weight, epsilon, variance_size=None) -> bool:
    return bool(_norm_ok(x, weight, variance_size))


def supports_fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    return bool(
        _norm_ok(x, weight, variance_size)
        and _npu(x_residual)
        and x_residual.dtype == x.dtype
        and x_residual.shape == x.shape
    )


def supports_silu_and_mul(x) -> bool:
    return bool(_npu(x) and 1 <= x.dim() <= 8 and x.shape[-1] % 2 == 0 and x.shape[-1] > 0)


def supports_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox) -> bool:
    if not (_npu(query) and _npu(key) and key.dtype == query.dtype):
        return False
    rot = cos_sin_cache.shape[-1] if cos_sin_cache.dim() == 2 else 0
    multiple = 16 if query.dtype == torch.float32 else 32
    return bool(
        query.dim() == 2
        and key.dim() == 2
        and positions.dim() == 1
        and query.shape[0] == positions.shape[0] == key.shape[0]
        and query.shape[1] % head_size == 0
        and key.shape[1] % head_size == 0
        and cos_sin_cache.device == query.device
        # npu_mrope takes the cache in the activations' dtype; casting a whole cache per
        # call would cost more than the kernel saves, so other dtypes go to native.
        and cos_sin_cache.dtype == query.dtype
        and rot > 0
        and rot % multiple == 0
    )


@ops.rms_norm.register_impl(PROVIDER, supported=SUPPORTED, supports_args=supports_rms_norm)
def rms_norm(x, weight, epsilon, variance_size=None):
    y, _rstd = torch_npu.npu_rms_norm(x, weight, float(epsilon))
    return y


@ops.fused_add_rms_norm.register_impl(
    PROVIDER, supported=SUPPORTED, supports_args=supports_fused_add_rms_norm
)
def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
    y, _rstd, residual = torch_npu.npu_add_rms_norm(x, x_residual, weight, float(epsilon))
    return y, residual


@ops.silu_and_mul.register_impl(PROVIDER, supported=SUPPORTED, supports_args=supports_silu_and_mul)
def silu_and_mul(x):
    return torch_npu.npu_swiglu(x, dim=-1)


@ops.rotary_embedding.register_impl(
    PROVIDER, supported=SUPPORTED, supports_args=supports_rotary_embedding
)
def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    q, k = torch_npu.npu_mrope(
        positions,
        query,
        key,
        cos_sin_cache,
        head_size,
        mrope_section=[0, 0, 0],
        rotary_mode="half" if is_neox else "interleave",
    )
    return q, k
