"""opcore-plugin-rocm: the in-tree AMD GPU platform.

`probe` is this distribution's entry point in ``opcore.intree_platform_plugins``.
"""

from __future__ import annotations

from opcore_plugin_rocm.probe import probe

__all__ = ["probe"]
