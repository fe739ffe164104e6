"""`CpuPlatform`: the host CPU, answered from the OS and torch."""

from __future__ import annotations

import functools
import os
import platform as _pyplatform

import torch

from opcore.platforms import Platform


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def _model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _pyplatform.processor() or _pyplatform.machine() or "CPU"


def usable_cores() -> int:
    """Cores this process may run on (affinity mask), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def native_dtypes() -> tuple[str, ...]:
    """Reduced-precision dtypes this CPU has instructions for (torch emulates the rest)."""
    flags = _cpu_flags()
    out = []
    if flags & {"avx512_bf16", "amx_bf16"}:
        out.append("bfloat16")
    if flags & {"avx512_fp16", "amx_fp16"}:
        out.append("float16")
    return tuple(out)


# What the native functions have on the CPU (docs/properties.md), as `opcore conformance
# --checks batch_invariance,determinism` measured it (2026-12-01, torch 2.13 on 2 cores;
# the widest sample of each op).
# gelu_and_mul is not batch-invariant in float32: torch's vectorised erf and its scalar
# loop for the last few elements of a buffer round differently, so a row's bits depend on
# where in the batch it lands. No graphs here, so nothing is declared capture-safe.
_INVARIANT = frozenset({"batch_invariant", "deterministic"})
NATIVE_PROPERTIES = {
    "rms_norm": _INVARIANT,
    "fused_add_rms_norm": _INVARIANT,
    "silu_and_mul": _INVARIANT,
    "gelu_and_mul": frozenset({"deterministic"}),
    "rotary_embedding": _INVARIANT,
    "split_qkv_rmsnorm_rope": _INVARIANT,
    # fp8 quantization (measured the same way, 2026-12-01): the scales are maxima, exact
    # in any order, and the norms' sums are batch-invariant here as above.
    "scaled_fp8_quant": _INVARIANT,
    "dynamic_per_token_scaled_fp8_quant": _INVARIANT,
    "per_token_group_quant_fp8": _INVARIANT,
    "rms_norm_static_fp8_quant": _INVARIANT,
    "fused_add_rms_norm_static_fp8_quant": _INVARIANT,
    "rms_norm_dynamic_per_token_quant": _INVARIANT,
    "silu_and_mul_fp8_quant": _INVARIANT,
    "silu_and_mul_per_token_group_fp8_quant": _INVARIANT,
    # Mixture of experts (measured the same way, 2026-12-02): the routers are per-row
    # softmax/sigmoid and a stable sort. fused_experts repeats (determinism passes) but is
    # not claimed batch-invariant: each expert's rows go through one matmul whose blocking
    # follows how many rows the batch routes there, and the suite has no row sample of it.
    "topk_softmax": _INVARIANT,
    "grouped_topk": _INVARIANT,
    "fused_experts": frozenset({"deterministic"}),
    # The collectives, through this platform's communicator (gloo), measured with 2 and 3
    # ranks: deterministic. Not batch-invariant: with 3 ranks a row is summed in an order
    # that follows its place in the buffer (10 of 12 rows differed alone vs in batches);
    # with 2 it holds only because a + b == b + a.
    "all_reduce": frozenset({"deterministic"}),
    "fused_all_reduce_add_rms_norm": frozenset({"deterministic"}),
}


class CpuPlatform(Platform):
    """The host CPU as one device. Every floating dtype of the ops is computed here:
    fp32 natively, bf16 and fp16 natively where the CPU has the instructions
    (`native_dtypes`) and by torch's conversion paths otherwise."""

    name = "cpu"
    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"
    dist_backend = "gloo"
    device_control_env_var = None
    supported_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    plugin_api = ("2.0", "3.0")

    def device_count(self) -> int:
        return 1

    def get_device_name(self, index: int = 0) -> str:
        return _model_name()

    def get_device_total_memory(self, index: int = 0) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def core_count(self) -> int:
        return usable_cores()

    def import_ir_kernels(self) -> None:
        # The IPEX provider registers itself only when intel-extension-for-pytorch imports.
        from opcore.ir import get_op
        from opcore_plugin_cpu import ipex_provider  # noqa: F401

        for op, properties in NATIVE_PROPERTIES.items():
            get_op(op).declare_native_properties(properties)

    def get_default_ir_op_priority(self, config) -> dict[str, list[str]]:
        # IPEX's kernels first for the ops it covers, where IPEX imported (its
        # supports_args sends what it does not handle to native); native otherwise.
        from opcore_plugin_cpu import ipex_provider

        if not ipex_provider.REGISTERED:
            return {}
        return {op: [ipex_provider.PROVIDER] for op in ipex_provider.OPS}

    def device_summary(self) -> dict[str, object]:
        return {
            **super().device_summary(),
            "cores": usable_cores(),
            "isa": torch.backends.cpu.get_cpu_capability(),
            "native_reduced_precision": list(native_dtypes()),
            "threads": torch.get_num_threads(),
        }
