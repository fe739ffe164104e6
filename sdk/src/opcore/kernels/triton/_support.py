"""What the Triton providers can run on, answered from tensor metadata alone.

Everything here is plain Python over shapes, strides, dtypes and device types: it runs on
fake tensors during compilation and never touches data or the device.
"""

from __future__ import annotations

import math
import os

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)

# Triton backend name -> the torch device type whose tensors that backend drives.
_BACKEND_DEVICE = {"nvidia": "cuda", "amd": "cuda", "intel": "xpu"}


def triton_importable() -> bool:
    """True when `import triton` succeeds (the provider's static `supported`)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # any failure (missing, broken install) means "not supported"
        return False
    return True


def interpreter_requested() -> bool:
    """True when TRITON_INTERPRET asks for Triton's CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def driven_device_types(interpreted: bool) -> frozenset[str]:
    """Torch device types whose tensors these kernels accept.

    Compiled kernels run on the devices of Triton's installed backends (nvidia and amd
    drive torch's ``cuda`` device type, intel drives ``xpu``). Kernels built under the
    interpreter (``interpreted``) run on host memory, so they take CPU tensors only.
    """
    if interpreted:
        return frozenset({"cpu"})
    try:
        from triton.backends import backends
    except Exception:
        return frozenset()
    return frozenset(_BACKEND_DEVICE[name] for name in backends if name in _BACKEND_DEVICE)


def row_stride(t: torch.Tensor) -> int | None:
    """The single stride that walks every row of ``t`` seen as ``[prod(shape[:-1]), shape[-1]]``
    without a copy, or ``None`` when the leading dims cannot be flattened that way.

    The last dim must be contiguous (stride 1), which is what lets q/k/v column slices of
    one QKV buffer be used in place: their rows are strided, their elements are not.
    """
    if t.dim() == 0:
        return None
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return None
    return _collapsed_stride(tuple(t.shape[:-1]), tuple(t.stride()[:-1]), default=t.shape[-1])


def _collapsed_stride(shape: tuple[int, ...], stride: tuple[int, ...], default: int) -> int | None:
    dims = [(s, st) for s, st in zip(shape, stride, strict=True) if s != 1]
    if not dims:
        return default
    for (_, st_outer), (s_inner, st_inner) in zip(dims, dims[1:], strict=False):
        if st_outer != st_inner * s_inner:
            return None
    return dims[-1][1]


def head_layout(t: torch.Tensor, num_tokens: int, head_size: int) -> tuple[int, int, int] | None:
    """``(token_stride, head_stride, num_heads)`` of ``t`` seen as ``[num_tokens, heads, head_size]``.

    Accepts ``[..., heads, head_size]`` whose leading dims multiply to ``num_tokens`` and
    ``[..., heads * head_size]`` whose leading dims multiply to ``num_tokens``; the last
    dim must be contiguous. ``None`` when ``t`` has neither layout without a copy.
    """
    if t.dim() == 0 or head_size <= 0:
        return None
    shape, stride = tuple(t.shape), tuple(t.stride())
    if shape[-1] > 1 and stride[-1] != 1:
        return None
    if t.dim() >= 2 and shape[-1] == head_size and math.prod(shape[:-2]) == num_tokens:
        tok = _collapsed_stride(shape[:-2], stride[:-2], default=0)
        if tok is None:
            return None
        return tok, stride[-2], shape[-2]
    if shape[-1] % head_size == 0 and math.prod(shape[:-1]) == num_tokens:
        tok = _collapsed_stride(shape[:-1], stride[:-1], default=0)
        if tok is None:
            return None
        return tok, head_size, shape[-1] // head_size
    return None


def on_devices(devices: frozenset[str], *tensors: torch.Tensor | None) -> bool:
    """All given tensors live on one device whose type is in ``devices``."""
    first = None
    for t in tensors:
        if t is None:
            continue
        if t.device.type not in devices:
            return False
        if first is None:
            first = t.device
        elif t.device != first:
            return False
    return True
