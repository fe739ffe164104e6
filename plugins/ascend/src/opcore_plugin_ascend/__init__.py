"""opcore-plugin-ascend: Huawei Ascend NPUs through torch_npu and the CANN runtime.

An out-of-tree platform (entry-point group ``opcore.platform_plugins``): when its probe
finds an NPU it wins over every in-tree platform. Importing this package imports neither
torch_npu nor Triton.
"""

from __future__ import annotations

from opcore_plugin_ascend.detect import probe

__all__ = ["probe"]
