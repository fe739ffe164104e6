"""Ascend layer replacements, registered by `AscendPlatform.import_kernels` (so only once
the Ascend platform is active, never merely because the plugin is installed).

* `AscendRMSNorm` replaces ``RMSNorm`` (``register_oot`` under the op name ``rms_norm``,
  so ``custom_ops="-rms_norm"`` still switches it back to ``forward_native``). Its
  ``forward_oot`` calls torch_npu's ``npu_rms_norm`` / ``npu_add_rms_norm`` directly for
  the arguments those kernels take, and ``forward_native`` for the rest.
* `AscendAttention` replaces ``Attention`` (``PluggableLayer.register_oot``): the same
  layer, with the backend pinned to ``ASCEND`` unless the caller or the configuration
  names another, so a model on an NPU never silently runs the slow reference attention.
"""

from __future__ import annotations

import torch

from opcore.layers import RMSNorm
from opcore.layers.attention import Attention


class AscendRMSNorm(RMSNorm):
    def forward_oot(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        from opcore_plugin_ascend import npu_provider as npu

        eps, var = self.variance_epsilon, self.variance_size_override
        if npu.SUPPORTED:
            if residual is None:
                if npu.supports_rms_norm(x, self.weight, eps, var):
                    return npu.rms_norm(x, self.weight, eps)
            elif npu.supports_fused_add_rms_norm(x, residual, self.weight, eps, var):
                return npu.fused_add_rms_norm(x, residual, self.weight, eps)
        return self.forward_native(x, residual)


class AscendAttention(Attention):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None, *,
                 backend: str | None = None, **kwargs) -> None:
        if backend is None:
            from opcore.config import get_current_config

            backend = get_current_config().attention.backend or "ASCEND"
        super().__init__(num_heads, head_size, scale, num_kv_heads, backend=backend, **kwargs)


def register_layers() -> None:
    """Idempotent: registering the same replacement again is a no-op."""
    RMSNorm.register_oot(AscendRMSNorm)
    Attention.register_oot(AscendAttention)
