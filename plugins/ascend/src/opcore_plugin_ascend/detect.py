"""The Ascend plugin's probe: torch_npu imports and an NPU is present.

When torch_npu is missing or fails to import, the reason is kept verbatim for
`opcore.platforms.explain()` and `opcore info`. On a host without the CANN runtime the
import fails in torch_npu's C extension, e.g. ``ImportError: libhccl.so: cannot open
shared object file: No such file or directory`` (torch_npu 2.13).

Note: torch >= 2.5 imports installed device extensions (``torch.backends`` entry points)
during ``import torch``; with torch_npu installed and CANN absent, ``import torch`` itself
fails unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``. With that set, this probe reports the
import error.
"""

from __future__ import annotations

import importlib.util
import os

from opcore.platforms import Absent

PLATFORM_CLASS = "opcore_plugin_ascend.platform.AscendPlatform"
_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def probe() -> str | Absent:
    """Entry point of ``opcore.platform_plugins:ascend``."""
    if importlib.util.find_spec("torch_npu") is None:
        return Absent(
            "torch_npu is not installed (pip install 'opcore-plugin-ascend[npu]' on a host "
            "with the CANN toolkit)"
        )
    saved = os.environ.get(_AUTOLOAD)
    try:
        import torch_npu  # noqa: F401  (the import is the check: it loads CANN)
    except Exception as exc:  # the import error is the reason, kept verbatim
        # torch_npu sets TORCH_DEVICE_BACKEND_AUTOLOAD=0 before it fails: a probe leaves
        # the environment as it found it.
        if saved is None:
            os.environ.pop(_AUTOLOAD, None)
        else:
            os.environ[_AUTOLOAD] = saved
        return Absent(f"torch_npu failed to import: {type(exc).__name__}: {exc}")
    import torch

    if not torch.npu.is_available():
        return Absent(
            "torch_npu imported, but torch.npu.is_available() is False (no NPU visible; check "
            "ASCEND_RT_VISIBLE_DEVICES and the driver)"
        )
    count = torch.npu.device_count()
    if count < 1:
        return Absent("torch_npu imported, but torch.npu.device_count() is 0")
    return PLATFORM_CLASS
