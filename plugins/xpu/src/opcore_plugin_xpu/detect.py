"""The XPU plugin's probe: ``torch.xpu.is_available()``, with the reason when it is not.

Pure: it asks torch (already imported by the core) and registers nothing.
"""

from __future__ import annotations

import torch

from opcore.platforms import Absent

PLATFORM_CLASS = "opcore_plugin_xpu.platform.XpuPlatform"


def probe() -> str | Absent:
    """Entry point of ``opcore.intree_platform_plugins:xpu``."""
    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return Absent(f"torch {torch.__version__} has no torch.xpu module")
    if not xpu._is_compiled():
        return Absent(
            f"torch {torch.__version__} was built without XPU support "
            f"(torch.xpu.is_available() is False); install an XPU build of torch"
        )
    if not xpu.is_available():
        return Absent(
            "torch.xpu.is_available() is False: no Intel GPU was found by the Level Zero "
            "driver (check the driver install and ZE_AFFINITY_MASK)"
        )
    return PLATFORM_CLASS
