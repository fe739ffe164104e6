"""`CudaPlatform`: NVIDIA GPUs, answered by torch.cuda (device queries, through
`TorchDevicePlatform`) and NVML (facts that must not create a CUDA context, such as the
capability used for dtypes)."""

from __future__ import annotations

import functools
from typing import Any

import torch

from opcore.kernels import triton_default_priority
from opcore.platforms.torch_device import TorchDevicePlatform


@functools.cache
def nvml_min_capability() -> tuple[int, int] | None:
    """The lowest compute capability among the driver's GPUs, or ``None`` without NVML.

    Read through NVML so that importing this module creates no CUDA context."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            caps = [
                tuple(
                    pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(i))
                )
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
    return min(caps) if caps else None


def dtypes_for_capability(cap: tuple[int, int] | None) -> tuple[torch.dtype, ...]:
    """fp32 and fp16 on every GPU torch supports; bf16 from sm80 (Ampere) on. Unknown
    capability: all three (the usual case for current datacentre GPUs)."""
    if cap is not None and cap < (8, 0):
        return (torch.float32, torch.float16)
    return (torch.float32, torch.float16, torch.bfloat16)


def fp8_for_capability(cap: tuple[int, int] | None) -> torch.dtype | None:
    """``torch.float8_e4m3fn`` on sm89 (Ada) and later, which compute fp8; else ``None``."""
    return torch.float8_e4m3fn if cap is not None and cap >= (8, 9) else None


def tensor_descriptor_copies_for_capability(cap: tuple[int, int] | None) -> bool:
    """The Tensor Memory Accelerator copies descriptor tiles from sm90 (Hopper) on."""
    return cap is not None and cap >= (9, 0)


_CAP = nvml_min_capability()


# What the native functions have on this device (docs/properties.md), as `opcore
# conformance` measured it on an H200 (torch 2.11, 2026-12-01; bench/results/
# 2026-12-01-h200-properties). Torch's elementwise kernels compute each element alone, and
# a max is exact in any order, so the activations, rotary and the quantizers whose scales
# are row or group maxima are batch-invariant. Its row reductions (the norms) choose how
# many threads share a row from the tensor's shape, so a row's sum may be added up in
# another order in a larger batch: rms_norm differed in every dtype, fused_add_rms_norm
# and rms_norm_dynamic_per_token_quant in float32. The other norm-based ops held on the
# rows checked (the fp8 or bf16 rounding of the output absorbed a last-bit difference of
# the sum) but share that hidden-wide reduction, so they do not claim it. All were deterministic and
# replayed from a CUDA graph.
_ALL = frozenset({"batch_invariant", "deterministic", "capture_safe"})
_REDUCING = frozenset({"deterministic", "capture_safe"})
NATIVE_PROPERTIES = {
    "rms_norm": _REDUCING,
    "fused_add_rms_norm": _REDUCING,
    "silu_and_mul": _ALL,
    "gelu_and_mul": _ALL,
    "rotary_embedding": _ALL,
    # Its norm is per head and in fp32 whatever the dtype (a sum of head_size values, 64,
    # 80 and 128 checked). Rows alone vs in batches of 3, 64 and 1000 tokens were bitwise
    # equal in every dtype in both H200 runs (the 01:42 full run and the 02:09 re-run,
    # bench/results/2026-12-01-h200-properties), float32 included, where no output
    # rounding can hide a difference of the sum (the fp8 norm ops below cannot say that).
    "split_qkv_rmsnorm_rope": _ALL,
    "scaled_fp8_quant": _ALL,
    "dynamic_per_token_scaled_fp8_quant": _ALL,
    "per_token_group_quant_fp8": _ALL,
    "silu_and_mul_fp8_quant": _ALL,
    "silu_and_mul_per_token_group_fp8_quant": _ALL,
    "rms_norm_static_fp8_quant": _REDUCING,
    "fused_add_rms_norm_static_fp8_quant": _REDUCING,
    "rms_norm_dynamic_per_token_quant": _REDUCING,
}


class CudaPlatform(TorchDevicePlatform):
    """NVIDIA GPUs. Kernels: the portable Triton providers (`opcore.kernels.triton`),
    preferred to native for the ops of `opcore.kernels.TRITON_OPS` (reached by the layers'
    ``forward_native``);
    attention tries ``TRITON_PAGED`` then ``TORCH_NATIVE``."""

    name = "cuda"
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"
    dist_backend = "nccl"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"
    supported_dtypes = dtypes_for_capability(_CAP)
    supported_quantization = ("fp8",) if fp8_for_capability(_CAP) is not None else ()
    fp8_dtype = fp8_for_capability(_CAP)
    # PTX converts float32 to e4m3/e5m2 only with .satfinite (cvt.rn.satfinite.e4m3x2.f32:
    # out-of-range values and infinities to the largest finite value, NaN kept), the
    # conversion Triton emits from sm89 on.
    fp8_convert_saturates = fp8_dtype is not None
    plugin_api = ("2.0", "3.0")

    def tensor_descriptor_copies(self, index: int = 0) -> bool:
        return tensor_descriptor_copies_for_capability(self.get_device_capability(index))

    # ------------------------------------------------------------------ hooks
    def graph_class(self) -> Any:
        # torch before torch.accelerator.Graph (the H200's 2.11 among them) captures through
        # torch.cuda.CUDAGraph, which has the same capture_begin/capture_end/replay shape.
        return super().graph_class() or torch.cuda.CUDAGraph

    def import_ir_kernels(self) -> None:
        import opcore.kernels.triton  # noqa: F401  (registers provider "triton")
        import opcore.kernels.triton.batch_invariant  # noqa: F401  (its row-count-free variant)
        from opcore.ir import get_op

        for op, properties in NATIVE_PROPERTIES.items():
            get_op(op).declare_native_properties(properties)

    def get_default_ir_op_priority(self, config: Any) -> dict[str, list[str]]:
        return triton_default_priority()

    def get_device_communicator_cls(self) -> str | None:
        return "opcore_plugin_cuda.communicator.CudaCommunicator"

    def get_attn_backend_candidates(self, cfg: Any) -> list[str]:
        return ["TRITON_PAGED", "TORCH_NATIVE"]

    def device_summary(self) -> dict[str, Any]:
        out = super().device_summary()
        out["cuda_runtime"] = torch.version.cuda
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                out["driver"] = pynvml.nvmlSystemGetDriverVersion()
            finally:
                pynvml.nvmlShutdown()
        except Exception as exc:
            out["driver"] = f"unknown ({type(exc).__name__})"
        return out
