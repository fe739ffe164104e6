"""`AscendPlatform`: Huawei Ascend NPUs (torch device ``npu``) through torch_npu.

Mapping onto opcore:

* identity: device type ``npu``, dispatch key ``PrivateUse1`` (torch_npu's backend key),
  ``hccl``, ``ASCEND_RT_VISIBLE_DEVICES``;
* providers (`import_ir_kernels`): ``npu`` (torch_npu kernels) on rms_norm,
  fused_add_rms_norm, silu_and_mul and rotary_embedding; ``ascend_triton`` (the NPU-tiled
  Triton kernel) on split_qkv_rmsnorm_rope;
* layers (`import_kernels`): `AscendAttention` replaces ``Attention`` (``register_oot``),
  only once this platform is active; the other layers reach the ``npu`` providers through
  their ``forward_native``;
* attention: ``ASCEND`` first, ``TORCH_NATIVE`` as the fallback candidate; `import_kernels`
  registers the name ``ASCEND`` in the attention registry (a class path only).

torch_npu is imported inside methods (`device_module`); the class itself imports anywhere.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from opcore.platforms.torch_device import TorchDevicePlatform

ASCEND_BACKEND = "opcore_plugin_ascend.attention.AscendBackend"
DEFAULT_PRIORITY = {
    "rms_norm": ["npu"],
    "fused_add_rms_norm": ["npu"],
    "silu_and_mul": ["npu"],
    "rotary_embedding": ["npu"],
    "split_qkv_rmsnorm_rope": ["ascend_triton"],
}


class AscendPlatform(TorchDevicePlatform):
    name = "ascend"
    device_name = "npu"
    device_type = "npu"
    dispatch_key = "PrivateUse1"
    dist_backend = "hccl"
    device_control_env_var = "ASCEND_RT_VISIBLE_DEVICES"
    supported_dtypes = (torch.float32, torch.float16, torch.bfloat16)
    supported_quantization = ()
    fp8_dtype = None  # torch_npu quantizes to int8/int4 only: npu_provider.FP8_QUANT_OPS
    plugin_api = ("2.0", "3.0")
    conformance_expectations = "opcore_plugin_ascend:expectations.toml"

    # ------------------------------------------------------------------ device queries
    # torch.npu answers the rest (`TorchDevicePlatform`) once torch_npu has registered it.
    def device_module(self) -> ModuleType:
        import torch_npu  # noqa: F401  (registers the "npu" device type and torch.npu)

        return super().device_module()

    def get_device_capability(self, index: int = 0) -> tuple[int, int] | None:
        # NPUs have no (major, minor) compute capability.
        return None

    # ------------------------------------------------------------------ hooks
    def import_kernels(self) -> None:
        from opcore.attention.registry import register_backend
        from opcore_plugin_ascend import layers

        register_backend("ASCEND", ASCEND_BACKEND)
        layers.register_layers()

    def import_ir_kernels(self) -> None:
        from opcore_plugin_ascend import npu_provider, triton_provider  # noqa: F401

    def get_default_ir_op_priority(self, config) -> dict[str, list[str]]:
        # Named even when not usable (e.g. ascend_triton without triton-ascend): the core
        # then warns once instead of falling back to native in silence.
        return {op: list(providers) for op, providers in DEFAULT_PRIORITY.items()}

    def get_attn_backend_candidates(self, cfg: Any) -> list[str]:
        return ["ASCEND", "TORCH_NATIVE"]

    def get_device_communicator_cls(self) -> str | None:
        return None  # torch.distributed with the hccl backend that torch_npu registers
