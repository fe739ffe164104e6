"""The probe: are there AMD GPUs, and can this torch drive them?

Pure: registers nothing and imports nothing of the platform. amdsmi (shipped with ROCm)
is asked first; without it, a ROCm build of torch (``torch.version.hip``) is asked for its
device count.
"""

from __future__ import annotations

PLATFORM_CLASS = "opcore_plugin_rocm.platform.RocmPlatform"


def amdsmi_device_count() -> int:
    """GPUs amdsmi reports. Raises ``ImportError`` without amdsmi, amdsmi errors without
    a driver."""
    import amdsmi

    amdsmi.amdsmi_init()
    try:
        return len(amdsmi.amdsmi_get_processor_handles())
    finally:
        amdsmi.amdsmi_shut_down()


def probe():
    """``"opcore_plugin_rocm.platform.RocmPlatform"`` when an AMD GPU is found and torch is
    a ROCm build; otherwise ``opcore.platforms.Absent`` with the reason."""
    import torch

    from opcore.platforms import Absent

    hip = getattr(torch.version, "hip", None)
    try:
        count = amdsmi_device_count()
        source = "amdsmi"
    except ImportError as exc:
        if not hip:
            return Absent(
                f"amdsmi is not installed ({exc}) and torch {torch.__version__} is not a ROCm "
                f"build (torch.version.hip is None)"
            )
        count = torch.cuda.device_count()
        source = f"torch {torch.__version__} (HIP {hip}), amdsmi not installed"
    except Exception as exc:  # amdsmi errors: no driver, no library
        return Absent(f"amdsmi: {type(exc).__name__}: {exc}")
    if count <= 0:
        return Absent(f"{source} reports 0 AMD GPUs")
    if not hip:
        return Absent(
            f"amdsmi reports {count} AMD GPU(s) but torch {torch.__version__} is not a ROCm "
            f"build (torch.version.hip is None)"
        )
    return PLATFORM_CLASS
