"""opcore-plugin-vdev: a virtual accelerator, opcore's device type ``vdev``.

An in-tree platform that is never active by default: ``OPCORE_VDEV=1`` switches it on
(``OPCORE_VDEV_DEVICES``, ``OPCORE_VDEV_DTYPES`` and ``OPCORE_VDEV_MEMORY`` shape the
device, `opcore.vdev.settings_from_env`). The device itself is `opcore.vdev`, installed as
``vdev`` when the platform is constructed; `probe` only reads the environment.
"""

from __future__ import annotations

import os

ENV = "OPCORE_VDEV"
DEVICE_TYPE = "vdev"
PLATFORM_CLASS = "opcore_plugin_vdev.platform.VdevPlatform"
HOW_TO_ENABLE = (
    f"set {ENV}=1 to run opcore on the virtual device "
    "(OPCORE_VDEV_DEVICES=N for N devices, OPCORE_VDEV_DTYPES and OPCORE_VDEV_MEMORY to shape it)"
)


def probe():
    """``"opcore_plugin_vdev.platform.VdevPlatform"`` with ``OPCORE_VDEV=1``; otherwise
    ``Absent`` saying how to enable it. Raises ``ValueError`` for a value of ``OPCORE_VDEV``
    other than ``1``/``0`` or an unreadable device setting, so a typo is reported."""
    from opcore.platforms import Absent

    value = os.environ.get(ENV, "").strip()
    if value in ("", "0"):
        return Absent(f"the virtual device is off: {HOW_TO_ENABLE}")
    if value != "1":
        raise ValueError(f"{ENV}={value!r}: expected '1' (on) or '0' (off)")
    from opcore import vdev

    vdev.settings_from_env()  # raises naming the variable it cannot read
    import torch

    taken = torch._C._get_privateuse1_backend_name()
    if taken not in ("privateuseone", DEVICE_TYPE):
        return Absent(
            f"torch's PrivateUse1 backend is already taken by {taken!r} in this process, so "
            f"the virtual device cannot be named {DEVICE_TYPE!r}"
        )
    return PLATFORM_CLASS
