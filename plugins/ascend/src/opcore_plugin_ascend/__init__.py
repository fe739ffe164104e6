"""opcore-plugin-ascend: Huawei Ascend NPUs through torch_npu and the CANN runtime.

An out-of-tree platform (entry-point group ``opcore.platform_plugins``): when its probe
finds an NPU it wins over every in-tree platform. Importing this package imports neither
torch_npu nor Triton.
"""

from __future__ import annotations

from opcore_plugin_ascend.detect import probe

__all__ = ["probe", "register_general"]


def register_general() -> None:
    """``opcore.general_plugins:ascend``: name the ``ASCEND`` attention backend's class in
    the registry (a path only: nothing is imported). Idempotent."""
    from opcore.attention.registry import register_backend

    register_backend("ASCEND", "opcore_plugin_ascend.attention.AscendBackend")
