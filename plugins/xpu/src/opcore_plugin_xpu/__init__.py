"""opcore-plugin-xpu: Intel GPUs through torch's ``xpu`` device.

Importing this package imports no vendor library; `probe` decides whether the platform
activates.
"""

from __future__ import annotations

from opcore_plugin_xpu.detect import probe

__all__ = ["probe"]
