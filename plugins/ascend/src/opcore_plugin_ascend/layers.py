"""Ascend layer replacements, registered by `AscendPlatform.import_kernels` (so only once
the Ascend platform is active, never merely because the plugin is installed).

Kernels are not layer replacements: torch_npu's RMSNorm kernels are the ``npu`` provider
(`npu_provider`), which ``RMSNorm.forward_native`` reaches through the platform's priority.

* `AscendAttention` replaces ``Attention`` (``PluggableLayer.register_oot``): the same
  layer, with the backend pinned to ``ASCEND`` unless the caller or the configuration
  names another, so a model on an NPU never silently runs the slow reference attention.
"""

from __future__ import annotations

from opcore.layers.attention import Attention


class AscendAttention(Attention):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        *,
        backend: str | None = None,
        **kwargs,
    ) -> None:
        if backend is None:
            from opcore.settings import get_current_config

            backend = get_current_config().attention.backend or "ASCEND"
        super().__init__(num_heads, head_size, scale, num_kv_heads, backend=backend, **kwargs)


def register_layers() -> None:
    """Idempotent: registering the same replacement again is a no-op."""
    Attention.register_oot(AscendAttention)
