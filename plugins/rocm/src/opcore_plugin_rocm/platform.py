"""`RocmPlatform`: AMD GPUs through a ROCm build of torch (whose device type is ``cuda``)."""

from __future__ import annotations

from typing import Any

import torch

from opcore.kernels import triton_default_priority
from opcore.platforms.torch_device import TorchDevicePlatform


def fp8_for_arch(gcn_arch: str | None) -> torch.dtype | None:
    """The fp8 dtype of an AMD architecture: MI300 (gfx94x) computes the ``fnuz`` variant,
    MI350 (gfx95x) and RDNA4 (gfx12) the OCP ``e4m3fn`` one; older GPUs none."""
    if not gcn_arch:
        return None
    arch = gcn_arch.split(":")[0]
    if arch.startswith("gfx94"):
        return torch.float8_e4m3fnuz
    if arch.startswith(("gfx95", "gfx12")):
        return torch.float8_e4m3fn
    return None


def amdsmi_first_arch() -> str | None:
    """The first GPU's architecture name as amdsmi reports it (no HIP context is created),
    or ``None`` without amdsmi or a GPU."""
    try:
        import amdsmi

        amdsmi.amdsmi_init()
        try:
            handles = amdsmi.amdsmi_get_processor_handles()
            if not handles:
                return None
            info = amdsmi.amdsmi_get_gpu_asic_info(handles[0])
            return str(info.get("target_graphics_version") or "") or None
        finally:
            amdsmi.amdsmi_shut_down()
    except Exception:
        return None


_ARCH = amdsmi_first_arch()


class RocmPlatform(TorchDevicePlatform):
    """AMD GPUs. Same portable Triton providers as the cuda platform (reached by the
    layers' ``forward_native``); RCCL is reached through
    torch's ``nccl`` backend name. Device queries: torch.cuda, which a ROCm build of torch
    backs with HIP (`TorchDevicePlatform`)."""

    name = "rocm"
    device_name = "rocm"
    device_type = "cuda"  # ROCm builds of torch expose HIP devices as torch "cuda"
    dispatch_key = "CUDA"
    dist_backend = "nccl"  # RCCL, under torch.distributed's "nccl" name
    device_control_env_var = "HIP_VISIBLE_DEVICES"
    supported_dtypes = (torch.float32, torch.float16, torch.bfloat16)
    fp8_dtype = fp8_for_arch(_ARCH)
    supported_quantization = ("fp8",) if fp8_dtype is not None else ()
    plugin_api = ("2.0", "3.0")

    def graph_class(self) -> Any:
        # torch before torch.accelerator.Graph (2.11 among them) captures through
        # torch.cuda.CUDAGraph, which has the same capture_begin/capture_end/replay shape.
        return super().graph_class() or torch.cuda.CUDAGraph

    def gcn_arch(self, index: int = 0) -> str:
        """The device's architecture name, e.g. ``"gfx942:sramecc+:xnack-"``."""
        return torch.cuda.get_device_properties(index).gcnArchName

    def fp8_dtype_of(self, index: int = 0) -> torch.dtype | None:
        """The fp8 dtype device ``index`` computes (see `fp8_for_arch`)."""
        return fp8_for_arch(self.gcn_arch(index))

    def import_ir_kernels(self) -> None:
        import opcore.kernels.triton  # noqa: F401  (registers provider "triton")
        import opcore.kernels.triton.batch_invariant  # noqa: F401  (its row-count-free variant)

    def get_default_ir_op_priority(self, config: Any) -> dict[str, list[str]]:
        return triton_default_priority()

    def get_device_communicator_cls(self) -> str | None:
        return "opcore_plugin_rocm.communicator.RocmCommunicator"

    def get_attn_backend_candidates(self, cfg: Any) -> list[str]:
        return ["TRITON_PAGED", "TORCH_NATIVE"]
