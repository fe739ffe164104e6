"""`XpuPlatform`: Intel GPUs through torch's ``xpu`` device.

Providers, in the default priority: ``ipex`` (IPEX's XPU kernels, when
intel-extension-for-pytorch imports), then ``triton`` (the portable kernels of
`opcore.kernels.triton`, when Triton has its ``intel`` backend), then ``native``. A
provider that is not usable here is left out of the default instead of being named and
warned about on every host.
"""

from __future__ import annotations

from typing import Any

import torch

from opcore.platforms.torch_device import TorchDevicePlatform


def intel_triton_backend() -> bool:
    """True when the installed Triton has the ``intel`` backend (it drives torch ``xpu``)."""
    try:
        from triton.backends import backends
    except Exception:  # no Triton, or a broken one: no XPU Triton backend
        return False
    return "intel" in backends


class XpuPlatform(TorchDevicePlatform):
    """Intel GPUs; device queries answered by torch.xpu."""

    name = "xpu"
    device_name = "xpu"
    device_type = "xpu"
    dispatch_key = "XPU"
    dist_backend = "xccl"
    device_control_env_var = "ZE_AFFINITY_MASK"
    supported_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    plugin_api = ("2.0", "3.0")

    # ------------------------------------------------------------------ device queries
    # torch.xpu answers the rest (`TorchDevicePlatform`).
    def get_device_capability(self, index: int = 0) -> tuple[int, int] | None:
        # torch.xpu's capability is a dict of feature flags, not a (major, minor) pair.
        return None

    # ------------------------------------------------------------------ hooks
    def import_ir_kernels(self) -> None:
        import opcore.kernels.triton  # noqa: F401  (registers "triton"; supported iff Triton imports)
        from opcore_plugin_xpu import ipex_provider  # noqa: F401  (registers "ipex" iff IPEX imports)

    def default_providers(self) -> list[str]:
        """The providers usable here, best first (without ``native``)."""
        from opcore_plugin_xpu import ipex_provider

        out = []
        if ipex_provider.REGISTERED:
            out.append("ipex")
        if intel_triton_backend():
            out.append("triton")
        return out

    def get_default_ir_op_priority(self, config) -> dict[str, list[str]]:
        from opcore.ir import all_ops

        usable = self.default_providers()
        priority = {}
        for name, op in all_ops().items():
            chain = [p for p in usable if p in op.impls]
            if chain:
                priority[name] = chain
        return priority

    def get_attn_backend_candidates(self, cfg: Any) -> list[str]:
        return (["TRITON_PAGED"] if intel_triton_backend() else []) + ["TORCH_NATIVE"]
