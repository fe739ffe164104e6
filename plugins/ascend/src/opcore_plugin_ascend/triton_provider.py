"""Provider ``ascend_triton`` on ``split_qkv_rmsnorm_rope``: the NPU-tiled Triton kernel of
`opcore_plugin_ascend.triton_qkv`.

``supported`` when Triton imports. ``supports_args`` accepts NPU tensors when the
installed Triton has an Ascend backend (triton-ascend), and CPU tensors when the kernel
was built under Triton's interpreter (``TRITON_INTERPRET=1`` set before this module is
first imported), which is how the tests check it on a CPU host.
"""

from __future__ import annotations

import importlib.util

import torch

from opcore.ir import ops

PROVIDER = "ascend_triton"
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_HEAD_SIZE = 1024

HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON:
    from opcore_plugin_ascend import triton_qkv

    INTERPRETED = triton_qkv.INTERPRETED
else:
    triton_qkv = None
    INTERPRETED = False


def _ascend_triton_backend() -> bool:
    try:
        from triton.backends import backends
    except Exception:  # no usable Triton: no backend
        return False
    return bool({"npu", "ascend"} & set(backends))


DEVICE_TYPES = (
    frozenset({"cpu"})
    if INTERPRETED
    else (frozenset({"npu"}) if HAS_TRITON and _ascend_triton_backend() else frozenset())
)


def _flattenable(qkv: torch.Tensor) -> bool:
    """Rows reachable with one stride: 2-D with a contiguous last dim, or contiguous."""
    if qkv.shape[-1] > 1 and qkv.stride(-1) != 1:
        return False
    return qkv.dim() == 2 or qkv.is_contiguous()


def supports_split_qkv_rmsnorm_rope(
    qkv,
    q_weight,
    k_weight,
    epsilon,
    positions,
    cos_sin_cache,
    num_heads,
    num_kv_heads,
    head_size,
    is_neox,
) -> bool:
    device = qkv.device
    return bool(
        device.type in DEVICE_TYPES
        and qkv.dtype in FLOAT_DTYPES
        and _flattenable(qkv)
        and head_size <= MAX_HEAD_SIZE
        and all(
            w is None
            or (
                w.device == device and w.dtype in FLOAT_DTYPES and w.dim() == 1 and w.stride(0) == 1
            )
            for w in (q_weight, k_weight)
        )
        and positions.device == device
        and positions.dtype in INDEX_DTYPES
        and cos_sin_cache.device == device
        and cos_sin_cache.dtype in FLOAT_DTYPES
        and cos_sin_cache.dim() == 2
        and cos_sin_cache.stride(-1) == 1
    )


@ops.split_qkv_rmsnorm_rope.register_impl(
    PROVIDER, supported=HAS_TRITON, supports_args=supports_split_qkv_rmsnorm_rope
)
def split_qkv_rmsnorm_rope(
    qkv,
    q_weight,
    k_weight,
    epsilon,
    positions,
    cos_sin_cache,
    num_heads,
    num_kv_heads,
    head_size,
    is_neox,
):
    return triton_qkv.split_qkv_rmsnorm_rope_tiled(
        qkv,
        q_weight,
        k_weight,
        epsilon,
        positions,
        cos_sin_cache,
        num_heads,
        num_kv_heads,
        head_size,
        is_neox,
    )
