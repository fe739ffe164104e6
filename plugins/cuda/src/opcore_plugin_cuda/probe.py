"""The probe: are there NVIDIA GPUs, and can this torch drive them?

Pure: it imports nothing of the platform, registers nothing and creates no CUDA context
(NVML talks to the driver, not to the CUDA runtime, so forking after a probe is safe).
"""

from __future__ import annotations

PLATFORM_CLASS = "opcore_plugin_cuda.platform.CudaPlatform"


def nvml_device_count() -> int:
    """GPUs the NVIDIA driver reports (all of them; CUDA_VISIBLE_DEVICES does not apply).

    Raises ``ImportError`` without nvidia-ml-py and ``pynvml.NVMLError`` without a driver.
    """
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def probe():
    """``"opcore_plugin_cuda.platform.CudaPlatform"`` when NVML reports a GPU and torch was
    built with CUDA; otherwise ``opcore.platforms.Absent`` with the reason."""
    from opcore.platforms import Absent

    try:
        count = nvml_device_count()
    except ImportError as exc:
        return Absent(f"nvidia-ml-py (pynvml) is not installed: {exc}")
    except Exception as exc:  # pynvml.NVMLError and its subclasses: no driver, no library
        return Absent(f"NVML: {type(exc).__name__}: {exc}")
    if count <= 0:
        return Absent("NVML reports 0 NVIDIA GPUs")
    import torch

    if torch.version.cuda is None:
        return Absent(
            f"NVML reports {count} NVIDIA GPU(s) but this torch ({torch.__version__}) was "
            f"built without CUDA"
        )
    return PLATFORM_CLASS
