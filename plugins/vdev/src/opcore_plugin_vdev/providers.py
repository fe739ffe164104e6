"""Provider ``vdev``: the virtual device's own kernels for rms_norm, fused_add_rms_norm and
silu_and_mul.

Each is written the way a device kernel would be (one fp32 pass: sum of squares over the
normalised width, a reciprocal square root, the scale; the gate and up halves read as
strided views, never copied), in torch ops on the ``vdev`` tensors themselves, so every
step runs through the virtual device's aten kernels. ``supports_args`` takes tensors on the
virtual device in a dtype it computes; anything else goes to the next provider.
"""

from __future__ import annotations

import torch

from opcore.ir import ops
from opcore_plugin_vdev import DEVICE_TYPE
from opcore_plugin_vdev.platform import PROVIDER, VdevPlatform

DTYPES = VdevPlatform.supported_dtypes


def _on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE_TYPE and t.dtype in DTYPES


def _norm_ok(x, weight) -> bool:
    return (
        _on_device(x)
        and x.dim() >= 1
        and (weight is None or (_on_device(weight) and weight.device == x.device))
    )


def supports_rms_norm(x, weight, epsilon, variance_size=None) -> bool:
    return bool(_norm_ok(x, weight))


def supports_fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    return bool(
        _norm_ok(x, weight)
        and _on_device(x_residual)
        and x_residual.dtype == x.dtype
        and x_residual.shape == x.shape
        and x_residual.device == x.device
    )


def supports_silu_and_mul(x) -> bool:
    return bool(_on_device(x) and x.dim() >= 1 and x.shape[-1] % 2 == 0)


def _normalize(x: torch.Tensor, weight, epsilon: float, variance_size) -> torch.Tensor:
    xf = x.float()
    width = x.shape[-1] if variance_size is None else variance_size
    xv = xf if variance_size is None else xf.narrow(-1, 0, variance_size)
    inv = torch.rsqrt((xv * xv).sum(dim=-1, keepdim=True) / width + epsilon)
    out = xf * inv
    if weight is not None:
        out = out * weight.float()
    return out.to(x.dtype).contiguous()


@ops.rms_norm.register_impl(PROVIDER, supports_args=supports_rms_norm)
def rms_norm(x, weight, epsilon, variance_size=None):
    return _normalize(x, weight, epsilon, variance_size)


@ops.fused_add_rms_norm.register_impl(PROVIDER, supports_args=supports_fused_add_rms_norm)
def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
    residual = (
        x + x_residual
    ).contiguous()  # rounded to the input dtype, as the op's contract says
    return _normalize(residual, weight, epsilon, variance_size), residual


@ops.silu_and_mul.register_impl(PROVIDER, supports_args=supports_silu_and_mul)
def silu_and_mul(x):
    d = x.shape[-1] // 2
    gate = x.narrow(-1, 0, d).float()
    up = x.narrow(-1, d, d).float()
    return (gate * torch.sigmoid(gate) * up).to(x.dtype).contiguous()
