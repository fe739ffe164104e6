"""What the Triton providers can run on, answered from tensor metadata alone.

Everything here is plain Python over shapes, strides, dtypes and device types: it runs on
fake tensors during compilation and never touches data or the device.
"""

from __future__ import annotations

import math
import os

import torch

from opcore.kernels import TRITON_BACKEND_DEVICE_TYPES

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


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
    return frozenset(
        TRITON_BACKEND_DEVICE_TYPES[name]
        for name in backends
        if name in TRITON_BACKEND_DEVICE_TYPES
    )


def row_layout(t: torch.Tensor) -> tuple[int, int, int] | None:
    """``(n_cols, n_rows, row_stride)`` of ``t`` seen as ``[prod(shape[:-1]), shape[-1]]``
    without a copy, or ``None`` when the leading dims cannot be flattened to one stride.

    The last dim must be contiguous (stride 1), which is what lets q/k/v column slices of
    one QKV buffer be used in place: their rows are strided, their elements are not.
    """
    shape = t.shape
    nd = len(shape)
    if nd == 0:
        return None
    stride = t.stride()
    n = shape[-1]
    if n > 1 and stride[-1] != 1:
        return None
    if nd == 2:  # the common case, answered without the general walk
        rows = shape[0]
        return n, rows, stride[0] if rows != 1 else n
    s = _collapsed_stride(tuple(shape[:-1]), tuple(stride[:-1]), default=n)
    if s is None:
        return None
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return n, rows, s


def row_stride(t: torch.Tensor) -> int | None:
    """The row stride of `row_layout`, or ``None``."""
    lay = row_layout(t)
    return None if lay is None else lay[2]


def require_row_stride(t: torch.Tensor, what: str) -> int:
    """`row_stride` of ``t``, or a ValueError naming ``what`` (e.g. ``"rms_norm: x"``).

    The providers' ``supports_args`` keep such tensors away from the kernels; this is the
    clear error for a direct caller of a launcher."""
    s = row_stride(t)
    if s is None:
        raise ValueError(
            f"{what} of shape {tuple(t.shape)} and strides {t.stride()} cannot be addressed "
            f"as rows with one stride and a contiguous last dim"
        )
    return s


def _collapsed_stride(shape: tuple[int, ...], stride: tuple[int, ...], default: int) -> int | None:
    dims = [(s, st) for s, st in zip(shape, stride, strict=True) if s != 1]
    if not dims:
        return default
    for (_, st_outer), (s_inner, st_inner) in zip(dims, dims[1:], strict=False):
        if st_outer != st_inner * s_inner:
            return None
    return dims[-1][1]


def head_layout(t: torch.Tensor, num_tokens: int, head_size: int) -> tuple[int, int, int] | None:
    """``(token_stride, head_stride, num_heads)`` of ``t`` seen as
    ``[num_tokens, heads, head_size]``.

    Accepts ``[..., heads, head_size]`` whose leading dims multiply to ``num_tokens`` and
    ``[..., heads * head_size]`` whose leading dims multiply to ``num_tokens``; the last
    dim must be contiguous. ``None`` when ``t`` has neither layout without a copy.
    """
    shape: tuple[int, ...] = t.shape
    if len(shape) == 0 or head_size <= 0:
        return None
    stride = t.stride()
    if shape[-1] > 1 and stride[-1] != 1:
        return None
    if len(shape) == 2 and num_tokens != 1 and shape[0] == num_tokens:
        # [tokens, heads * head_size], the common case (the general rules give the same)
        if shape[1] % head_size:
            return None
        return stride[0], head_size, shape[1] // head_size
    shape = tuple(shape)
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


def device_check(device_types: frozenset[str]):
    """A function ``ok(*tensors) -> bool``: every non-None tensor is on one device whose type
    is in ``device_types``. Uses ``Tensor.is_<type>`` and ``get_device()`` (tens of ns)
    rather than ``tensor.device.type`` (hundreds), since it runs on every dispatch."""
    flags = [f"is_{d}" for d in sorted(device_types)]
    if not flags or not all(hasattr(torch.Tensor, f) for f in flags):
        types = frozenset(device_types)

        def slow(*tensors):
            first = None
            for t in tensors:
                if t is None:
                    continue
                if t.device.type not in types:
                    return False
                if first is None:
                    first = t.device
                elif t.device != first:
                    return False
            return True

        return slow
    if len(flags) == 1:
        flag = flags[0]

        def one(*tensors):
            index = None
            for t in tensors:
                if t is None:
                    continue
                if not getattr(t, flag):
                    return False
                i = t.get_device()
                if index is None:
                    index = i
                elif i != index:
                    return False
            return True

        return one

    def several(*tensors):
        first = None
        for t in tensors:
            if t is None:
                continue
            if not any(getattr(t, f) for f in flags):
                return False
            if first is None:
                first = t.device
            elif t.device != first:
                return False
        return True

    return several


def on_devices(devices: frozenset[str], *tensors: torch.Tensor | None) -> bool:
    """All given tensors live on one device whose type is in ``devices``."""
    return device_check(devices)(*tensors)
