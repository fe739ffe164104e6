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
#
# A fused op also has a budget against its unfused chain (the ops a compile fusion pass
# rewrites into it, run on their native functions): its own tolerance where it is defined
# as that chain, and more where it is defined to round the chain's intermediate once
# fewer (``chain=``; `fp8_chain_tolerance`).
DEFAULT_FP8_TOLERANCE: tuple[int, float] = (0, 0.0)
_FP8_TOLERANCES: dict[str, dict[torch.dtype, tuple[int, float]]] = {}
_FP8_CHAIN_TOLERANCES: dict[str, dict[torch.dtype, tuple[int, float]]] = {}


def _checked(op_name: str, table: dict[torch.dtype, tuple[int, float]], what: str):
    checked = {}
    for dtype, (ulps, fraction) in table.items():
        if isinstance(ulps, bool) or not isinstance(ulps, int) or ulps < 0:
            raise ValueError(f"{what} of {op_name!r} ({dtype}): max_ulps {ulps!r}")
        if not 0.0 <= float(fraction) <= 1.0:
            raise ValueError(f"{what} of {op_name!r} ({dtype}): fraction {fraction!r}")
        checked[dtype] = (ulps, float(fraction))
    return checked


def declare_fp8_tolerance(
    op_name: str,
    table: dict[torch.dtype, tuple[int, float]],
    *,
    chain: dict[torch.dtype, tuple[int, float]] | None = None,
) -> None:
    """Declare op ``op_name``'s fp8 tolerance, ``{input dtype: (max_ulps, fraction)}``
    (``max_ulps`` an int >= 0, ``fraction`` in [0, 1]); replaces an earlier declaration.
    ``chain``: the same form, the budget of the fused op against its unfused chain where
    that differs from ``table`` (see `fp8_chain_tolerance`)."""
    checked = _checked(op_name, table, "fp8 tolerance")
    chained = None if chain is None else _checked(op_name, chain, "fp8 chain tolerance")
    _FP8_TOLERANCES[op_name] = checked
    if chained is None:
        _FP8_CHAIN_TOLERANCES.pop(op_name, None)
    else:
        _FP8_CHAIN_TOLERANCES[op_name] = chained


def fp8_tolerance(op_name: str, dtype: torch.dtype) -> tuple[int, float]:
    """``(max_ulps, fraction)`` for op ``op_name``'s fp8 outputs on inputs of ``dtype``
    (`DEFAULT_FP8_TOLERANCE` when it declared none for that dtype)."""
    return _FP8_TOLERANCES.get(op_name, {}).get(dtype, DEFAULT_FP8_TOLERANCE)


def fp8_chain_tolerance(op_name: str, dtype: torch.dtype) -> tuple[int, float]:
    """``(max_ulps, fraction)`` between fused op ``op_name``'s fp8 outputs and those of its
    unfused chain on the native functions, on inputs of ``dtype``: the ``chain=`` table of
    its declaration, else its `fp8_tolerance` (a fused op defined as its chain)."""
    chain = _FP8_CHAIN_TOLERANCES.get(op_name)
    if chain is None:
        return fp8_tolerance(op_name, dtype)
    return chain.get(dtype, DEFAULT_FP8_TOLERANCE)
