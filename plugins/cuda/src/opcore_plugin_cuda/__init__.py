"""opcore-plugin-cuda: the in-tree NVIDIA GPU platform.

`probe` is this distribution's entry point in ``opcore.intree_platform_plugins``.
"""

from __future__ import annotations

from opcore_plugin_cuda.probe import probe

__all__ = ["probe"]
