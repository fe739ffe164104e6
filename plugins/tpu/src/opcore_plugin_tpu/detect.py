"""The TPU plugin's probe: is there an XLA device this plugin should drive?

Activation rules (pure: no registration, no runtime initialisation):

* ``torch_xla`` must be installed, built for the running torch's release (its major.minor
  equals torch's, as torch_xla requires); otherwise `Absent` with the reason. The probe does
  not import it: that loads the PJRT runtime and takes seconds (about 5 s on a loaded
  2-core host, more from a cold page cache), which a probe must not spend (resolution runs
  probes in a worker thread within ``OPCORE_PROBE_TIMEOUT_S``, default 10 s, and warns
  over 1 s). `TpuPlatform` imports it when it is constructed, i.e. once it has won
  resolution; an import failure there refuses the platform with the error itself.
* ``PJRT_DEVICE=TPU``: activate when at least one TPU chip is on the PCI bus.
* ``PJRT_DEVICE=CPU``: activate on XLA:CPU. Setting the variable is an explicit request
  for XLA; this is how the conformance suite runs the plugin on a machine without a TPU.
* ``PJRT_DEVICE`` unset: activate only when a TPU chip is on the PCI bus. torch_xla would
  itself fall back to XLA:CPU here, but a probe must never activate unconditionally: an
  installed plugin on an ordinary host stays inactive and says why.
* any other ``PJRT_DEVICE`` (``CUDA``, ``NEURON``, ...): inactive, that device belongs to
  another plugin.

The PJRT client is not created here: on a TPU host that would claim the chips, and it costs
seconds. The chips are counted from PCI vendor/device ids, which is what torch_xla itself
uses to pick its default device.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import re

from opcore.platforms import Absent

PLATFORM_CLASS = "opcore_plugin_tpu.platform.TpuPlatform"

# Google's PCI vendor id and the device ids of TPU chips (v2/v3, v4, v5e, v5p, v6e, 7x).
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICE_IDS = frozenset(
    {"0x0027", "0x005e", "0x0062", "0x0063", "0x0056", "0x006f", "0x0076"}
)
HANDLED_PJRT_DEVICES = ("TPU", "CPU")


def count_tpu_chips(sysfs_root: str = "/sys/bus/pci/devices") -> int:
    """TPU chips attached to this host through PCI (0 when sysfs is unreadable)."""
    count = 0
    for vendor_file in glob.glob(os.path.join(sysfs_root, "*", "vendor")):
        try:
            with open(vendor_file, encoding="ascii") as f:
                if f.read().strip() != GOOGLE_PCI_VENDOR:
                    continue
            with open(os.path.join(os.path.dirname(vendor_file), "device"), encoding="ascii") as f:
                if f.read().strip() in TPU_PCI_DEVICE_IDS:
                    count += 1
        except OSError:
            continue
    return count


def pjrt_device() -> str | None:
    """The PJRT device family requested by ``PJRT_DEVICE`` (``"TPU"``, ``"CPU"``, ...),
    upper-cased, without torch_xla's ``_<suffix>`` variants; ``None`` when unset."""
    raw = os.environ.get("PJRT_DEVICE", "").strip()
    return raw.split("_")[0].upper() if raw else None


def _release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string such as ``2.9.0+cu128``; ``None`` if unparsable."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def torch_xla_mismatch(torch_version: str | None = None) -> str | None:
    """Why the installed torch_xla cannot load into this torch (``None``: same release, or
    not decidable from the metadata). Reads distribution metadata only; imports nothing."""
    try:
        xla_version = importlib.metadata.version("torch_xla")
    except importlib.metadata.PackageNotFoundError:
        return None  # importable without metadata (a source checkout): let the import decide
    if torch_version is None:
        import torch  # already imported by opcore: free

        torch_version = torch.__version__
    xla, tor = _release(xla_version), _release(torch_version)
    if xla is None or tor is None or xla == tor:
        return None
    return (
        f"torch_xla {xla_version} is built for torch {xla[0]}.{xla[1]}, this is torch "
        f"{torch_version} (install the torch_xla release matching torch)"
    )


def probe() -> str | Absent:
    """Entry point of ``opcore.intree_platform_plugins:tpu``."""
    if importlib.util.find_spec("torch_xla") is None:
        return Absent(
            "torch_xla is not installed (pip install 'opcore-plugin-tpu[tpu]' on a TPU host, "
            "or 'opcore-plugin-tpu[xla]' and PJRT_DEVICE=CPU for XLA:CPU)"
        )
    requested = pjrt_device()
    if requested is not None and requested not in HANDLED_PJRT_DEVICES:
        return Absent(
            f"PJRT_DEVICE={os.environ['PJRT_DEVICE']} asks torch_xla for a device this "
            f"plugin does not drive (it drives {' and '.join(HANDLED_PJRT_DEVICES)})"
        )
    if requested != "CPU":
        chips = count_tpu_chips()
        if chips == 0:
            how = "PJRT_DEVICE=TPU is set but" if requested == "TPU" else "PJRT_DEVICE is unset and"
            return Absent(
                f"{how} no TPU chip is on the PCI bus (vendor {GOOGLE_PCI_VENDOR}); "
                f"set PJRT_DEVICE=CPU to run this plugin on XLA:CPU"
            )
    mismatch = torch_xla_mismatch()
    if mismatch is not None:
        return Absent(mismatch)
    return PLATFORM_CLASS
