"""The fp8 format of the quantized ops (`opcore.ir.ops.scaled_fp8_quant` and siblings).

Which fp8 dtype they produce is a platform declaration (``Platform.fp8_dtype``): the ROCm
plugin declares ``float8_e4m3fnuz`` on MI300 (gfx94x), the cuda plugin
``float8_e4m3fn``; a platform declaring none (the cpu platform) gets ``float8_e4m3fn``.
Providers, fakes and the native functions all ask `fp8_dtype`, so they agree.
"""

from __future__ import annotations

import torch

# The dtypes the quantized ops produce; a platform declaring another one is refused by name.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
DEFAULT_FP8_DTYPE = torch.float8_e4m3fn
# The smallest dynamic scale (2**-126, the smallest normal float32): a row of zeros
# quantizes to zeros instead of 0 / 0, and every scale and its reciprocal stay normal.
MIN_SCALE = torch.finfo(torch.float32).tiny


def fp8_dtype() -> torch.dtype:
    """The fp8 dtype the quantized ops produce on the current platform: its declared
    ``fp8_dtype``, or ``float8_e4m3fn`` where it declares none.

    Raises:
        ValueError: the platform declares a dtype other than float8_e4m3fn/e4m3fnuz.
    """
    from opcore.platforms import get_current_platform

    declared = get_current_platform().fp8_dtype
    if declared is None:
        return DEFAULT_FP8_DTYPE
    if declared not in FP8_DTYPES:
        raise ValueError(
            f"opcore.ir.quant: the platform's fp8_dtype is {declared}; the quantized ops "
            f"produce float8_e4m3fn or float8_e4m3fnuz"
        )
    return declared


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of ``dtype`` (448.0 for e4m3fn, 240.0 for e4m3fnuz)."""
    return float(torch.finfo(dtype).max)
