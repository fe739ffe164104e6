"""Default per-dtype comparison tolerances ``(atol, rtol)`` for op outputs.

They bound the difference between a provider's output and the native reference computed
in higher precision on the CPU. Ops loosen them per dtype with ``register_op(tolerances=)``
or ``op.override_tolerance``.
"""

from __future__ import annotations

import torch

DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1.3e-6),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    try:
        return DEFAULT_TOLERANCES[dtype]
    except KeyError:
        known = ", ".join(str(d) for d in DEFAULT_TOLERANCES)
        raise ValueError(f"no default tolerance for dtype {dtype} (known: {known})") from None


# --------------------------------------------------------------------------- fp8 outputs
# An fp8 output is compared code by code: how many fp8 values apart a provider's element
# is from the float64 reference's (the reference is itself quantized: it is the native
# function run on float64 inputs). ``(max_ulps, fraction)``: no element more than
# ``max_ulps`` codes off, and at most ``fraction`` of them off at all. Declared per op and
# input dtype (`declare_fp8_tolerance`); an op that declares none must match exactly.
DEFAULT_FP8_TOLERANCE: tuple[int, float] = (0, 0.0)
_FP8_TOLERANCES: dict[str, dict[torch.dtype, tuple[int, float]]] = {}


def declare_fp8_tolerance(op_name: str, table: dict[torch.dtype, tuple[int, float]]) -> None:
    """Declare op ``op_name``'s fp8 tolerance, ``{input dtype: (max_ulps, fraction)}``
    (``max_ulps`` an int >= 0, ``fraction`` in [0, 1]); replaces an earlier declaration."""
    checked = {}
    for dtype, (ulps, fraction) in table.items():
        if isinstance(ulps, bool) or not isinstance(ulps, int) or ulps < 0:
            raise ValueError(f"fp8 tolerance of {op_name!r} ({dtype}): max_ulps {ulps!r}")
        if not 0.0 <= float(fraction) <= 1.0:
            raise ValueError(f"fp8 tolerance of {op_name!r} ({dtype}): fraction {fraction!r}")
        checked[dtype] = (ulps, float(fraction))
    _FP8_TOLERANCES[op_name] = checked


def fp8_tolerance(op_name: str, dtype: torch.dtype) -> tuple[int, float]:
    """``(max_ulps, fraction)`` for op ``op_name``'s fp8 outputs on inputs of ``dtype``
    (`DEFAULT_FP8_TOLERANCE` when it declared none for that dtype)."""
    return _FP8_TOLERANCES.get(op_name, {}).get(dtype, DEFAULT_FP8_TOLERANCE)
