"""`TpuPlatform`: XLA devices through torch_xla's PJRT runtime (a TPU, or XLA:CPU).

Ops run through their native functions, which torch_xla traces lazily into XLA graphs:
XLA fuses them with their neighbours, so there is no per-op kernel to choose. The Pallas
provider (`opcore_plugin_tpu.pallas_provider`) is registered too, `supported` only on a
real TPU, and opt-in (see `get_default_ir_op_priority`).

Everything torch_xla is imported inside methods: this module imports without torch_xla,
so `opcore info` can describe the class on any host. Constructing `TpuPlatform` imports
torch_xla (resolution constructs only the winner).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from opcore.platforms import Platform

PALLAS_BACKEND = "opcore_plugin_tpu.attention.PallasBackend"


def _xr():
    import torch_xla.runtime as xr

    return xr


def pjrt_device_type() -> str:
    """``"TPU"`` or ``"CPU"``: the PJRT device family torch_xla runs on."""
    return str(_xr().device_type())


def on_real_tpu() -> bool:
    """True when torch_xla imports and its PJRT device family is TPU (not XLA:CPU)."""
    try:
        return pjrt_device_type() == "TPU"
    except Exception:  # torch_xla missing or broken: certainly not a TPU
        return False


class TpuPlatform(Platform):
    """A TPU (``PJRT_DEVICE=TPU``) or XLA:CPU (``PJRT_DEVICE=CPU``) through torch_xla.

    fp16 is declared because XLA computes it on both backends; TPUs have no native fp16
    units, so on a TPU it is converted (bf16 is the native reduced precision)."""

    name = "tpu"
    device_name = "tpu"
    device_type = "xla"
    dispatch_key = "XLA"
    # torch_xla registers the "xla" torch.distributed backend (torch_xla.distributed).
    dist_backend = "xla"
    device_control_env_var = "TPU_VISIBLE_CHIPS"
    supported_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    plugin_api = ("2.0", "3.0")
    conformance_expectations = "opcore_plugin_tpu:expectations.toml"

    def __init__(self) -> None:
        # The probe only checks that torch_xla is installed for this torch (it must answer
        # within the probe budget); the import itself takes seconds (it loads the PJRT
        # runtime), so it happens here, once this platform has won resolution (outside the
        # budget). A failing import refuses the platform: resolution records the error on
        # the candidate and falls back to the next rule.
        import torch_xla  # noqa: F401

    # ------------------------------------------------------------------ device queries
    # Written here rather than inherited from `TorchDevicePlatform`: torch_xla registers no
    # torch device module for "xla", and its answers come from the PJRT runtime in other
    # shapes (a device count of the addressable runtime devices, memory from
    # get_memory_info, a wait on dispatched device ops, an XLA RNG seed).
    def device_count(self) -> int:
        return _xr().addressable_runtime_device_count()

    def get_device_name(self, index: int = 0) -> str:
        attrs = _xr().global_runtime_device_attributes()
        label = attrs[index].get("name", index) if index < len(attrs) else index
        kind = os.environ.get("TPU_ACCELERATOR_TYPE") or pjrt_device_type()
        return f"XLA:{pjrt_device_type()} device {label} ({kind})"

    def get_device_total_memory(self, index: int = 0) -> int:
        if pjrt_device_type() == "CPU":
            # XLA:CPU has no allocator statistics (GetAllocatorStats is UNIMPLEMENTED):
            # its memory is the host's.
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        import torch_xla.core.xla_model as xm

        return int(xm.get_memory_info(self.device(index))["bytes_limit"])

    def synchronize(self) -> None:
        import torch_xla.core.xla_model as xm

        # Waits for the device work already dispatched; it does not cut the pending lazy
        # graph (that is torch_xla.sync(), which callers choose to place).
        xm.wait_device_ops()

    def manual_seed_all(self, seed: int) -> None:
        import torch_xla.core.xla_model as xm

        torch.manual_seed(seed)
        xm.set_rng_state(seed)

    def inference_mode(self) -> contextlib.AbstractContextManager[Any]:
        # Inference tensors cannot be captured by torch_xla's lazy tensors and functional
        # passes; no_grad gives the same autograd behaviour for inference.
        return torch.no_grad()

    def device(self, index: int = 0) -> torch.device:
        return torch.device("xla", index)

    # ------------------------------------------------------------------ hooks
    def import_kernels(self) -> None:
        # Name PALLAS in the attention registry once this platform is active (a path
        # only), so `opcore info` and the selector see it.
        from opcore.attention.registry import register_backend

        register_backend("PALLAS", PALLAS_BACKEND)

    def import_ir_kernels(self) -> None:
        from opcore_plugin_tpu import pallas_provider  # noqa: F401  (registers "pallas")

    def get_default_ir_op_priority(self, config) -> dict[str, list[str]]:
        # Native everywhere, on purpose: XLA fuses the native functions with their
        # neighbours, while a Pallas custom call is a fusion barrier. The Pallas kernels
        # are opt-in (OPCORE_IR_OP_PRIORITY="rms_norm=pallas") until measured on a TPU.
        return {}

    def get_attn_backend_candidates(self, cfg: Any) -> list[str]:
        # PALLAS is torch_xla's ragged paged attention kernel: a TPU custom call that
        # XLA:CPU cannot lower.
        return ["PALLAS", "TORCH_NATIVE"] if on_real_tpu() else ["TORCH_NATIVE"]

    def device_summary(self) -> dict[str, object]:
        summary = super().device_summary()
        summary["pjrt_device"] = pjrt_device_type()
        summary["visible_chips"] = os.environ.get(self.device_control_env_var or "")
        return summary
