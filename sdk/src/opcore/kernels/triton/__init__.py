"""Portable Triton kernels, registered as provider ``triton`` on the `opcore.ir` ops.

Shared by the cuda, rocm and xpu platforms, which import this package from their
``import_ir_kernels`` hook. Importing it registers the provider on every op of
`opcore.kernels.TRITON_OPS`: ``rms_norm``, ``fused_add_rms_norm`` (in place),
``silu_and_mul``, ``gelu_and_mul``, ``rotary_embedding`` (in place),
``split_qkv_rmsnorm_rope`` (one fused kernel), the eight fp8 ops
(`opcore.kernels.FP8_OPS`) and the mixture-of-experts ops ``topk_softmax``,
``grouped_topk`` and ``fused_experts`` (`opcore.kernels.MOE_OPS`).

The package imports without Triton or a GPU: the provider is then registered with
``supported=False`` (so `opcore info` shows why it does not run) and the kernel modules
are not imported. With Triton, each op's ``supports_args`` accepts exactly what the
kernels handle: fp32/fp16/bf16 tensors on one device that Triton drives (torch ``cuda``
for the nvidia and amd backends, ``xpu`` for intel), or CPU tensors when the kernels were
built under Triton's interpreter (``TRITON_INTERPRET=1`` set before this package is first
imported); a contiguous last dim; rows reachable with one stride (column slices of a wider
buffer such as q/k/v of one QKV buffer are used in place).
"""

from __future__ import annotations

from opcore.kernels.triton._support import triton_importable

HAS_TRITON = triton_importable()
PROVIDER = "triton"

from opcore.kernels.triton import _register  # noqa: E402  (needs HAS_TRITON)

INTERPRETED = _register.INTERPRETED
DEVICE_TYPES = _register.DEVICE_TYPES

__all__ = ["DEVICE_TYPES", "HAS_TRITON", "INTERPRETED", "PROVIDER"]
