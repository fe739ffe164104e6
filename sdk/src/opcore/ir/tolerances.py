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
