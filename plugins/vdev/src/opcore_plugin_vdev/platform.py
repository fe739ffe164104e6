"""`VdevPlatform`: opcore on the virtual accelerator `opcore.vdev`, device type ``vdev``.

Mapping onto opcore:

* identity: device type ``vdev`` on dispatch key ``PrivateUse1`` (renamed), ``gloo``;
  the dtypes it claims are the ones the device computes (``OPCORE_VDEV_DTYPES``, default
  float32, float16, bfloat16: no float64);
* construction installs the device (`opcore.vdev.install`) with the environment's
  settings; device queries answer from ``torch.vdev``;
* providers (`import_ir_kernels`): ``vdev`` on rms_norm, fused_add_rms_norm and
  silu_and_mul, first in the default priority, native after it;
* attention (`import_kernels`): ``VDEV`` (registered in the attention registry) first,
  ``TORCH_NATIVE`` as the fallback candidate;
* layers: ``forward_native`` reaches the ``vdev`` providers through the priority above.
"""

from __future__ import annotations

from typing import Any

import torch

from opcore import vdev
from opcore.platforms import Platform
from opcore_plugin_vdev import DEVICE_TYPE

VDEV_BACKEND = "opcore_plugin_vdev.attention.VdevBackend"
PROVIDER = "vdev"
PROVIDER_OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul")


def _settings() -> dict[str, Any]:
    try:
        return vdev.settings_from_env()
    except ValueError:
        return {}  # the probe reported it; the class must still import


class VdevPlatform(Platform):
    """The virtual accelerator (see the module doc)."""

    name = "vdev"
    device_name = "vdev"
    device_type = DEVICE_TYPE
    dispatch_key = "PrivateUse1"
    dist_backend = "gloo"
    device_control_env_var = None
    supported_dtypes = tuple(_settings().get("dtypes", vdev.DEFAULT_DTYPES))
    plugin_api = ("2.0", "3.0")
    conformance_expectations = "opcore_plugin_vdev:expectations.toml"

    def __init__(self) -> None:
        self.device_state = vdev.install(DEVICE_TYPE, **vdev.settings_from_env())

    # ------------------------------------------------------------------ device queries
    def device_count(self) -> int:
        return torch.vdev.device_count()

    def get_device_name(self, index: int = 0) -> str:
        return torch.vdev.get_device_name(index)

    def get_device_total_memory(self, index: int = 0) -> int:
        # OPCORE_VDEV_MEMORY, or the host's memory when the device is unbounded
        return torch.vdev.get_device_properties(index).total_memory

    def synchronize(self) -> None:
        torch.vdev.synchronize()

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)
        torch.vdev.manual_seed_all(seed)

    # ------------------------------------------------------------------ hooks
    def import_kernels(self) -> None:
        from opcore.attention.registry import register_backend

        register_backend("VDEV", VDEV_BACKEND)

    def get_attn_backend_candidates(self, cfg: Any) -> list[str]:
        return ["VDEV", "TORCH_NATIVE"]

    def import_ir_kernels(self) -> None:
        from opcore_plugin_vdev import providers  # noqa: F401  (registers provider "vdev")

    def get_default_ir_op_priority(self, config) -> dict[str, list[str]]:
        return {op: [PROVIDER, "native"] for op in PROVIDER_OPS}

    def device_summary(self) -> dict[str, Any]:
        out = super().device_summary()
        config = self.device_state.config
        out["virtual"] = True
        out["dtypes"] = [str(d).replace("torch.", "") for d in config.dtypes]
        out["memory_bytes"] = config.memory_bytes
        return out
