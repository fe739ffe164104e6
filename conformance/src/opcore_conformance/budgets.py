"""Error budgets: how much less accurate than ``native`` a provider may be.

Every ``numerics`` case also runs the ``native`` provider on the same inputs and the same
device, and measures both in ULPs of the output dtype against the float64 reference
(`opcore_conformance.tensors.ulp_error`). For each output, a provider fails when

    its peak ULP error > max(factor x native's peak ULP error, floor_ulps)

The factor says "no more than this many times less accurate than the reference math";
the floor keeps the rule from demanding more than a kernel can promise when native
happens to be exact: on fp16/bf16 outputs it is a little over one ULP, so an output that is
rounded correctly (<= 0.5 ULP) or faithfully (< 1 ULP: truncation, another rounding mode)
always passes, and one that lost precision before its last rounding (an accumulation in
the input dtype, a rounding twice, a dropped epsilon) does not. On float32 outputs the
floor is wide: reductions in another order and other ``exp``/``erf`` approximations
legitimately differ by tens of ULPs there, and the absolute tolerance is the tighter bound.

A budget is chosen per op and dtype, first found wins: the op's own declaration (an op
whose ``error_budget(dtype)`` returns ``(factor, floor_ulps)``), then the suite's per-op
table `OP_BUDGETS`, then the defaults. It is never set per provider: a provider that
cannot meet it declares the case in its expectations file (``xfail``, with the reason).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from opcore_conformance import irapi

DEFAULT_FACTOR = 2.0
DEFAULT_FLOOR_ULPS = {"float16": 1.1, "bfloat16": 1.1, "float32": 256.0, "float64": 256.0}
FALLBACK_FLOOR_ULPS = 1.1  # a floating dtype not named above

# The suite's per-op table: {op name: {"factor": f, "floor_ulps": {dtype: u}}}; every key
# optional, the defaults fill the rest.
OP_BUDGETS: dict[str, dict[str, Any]] = {
    # The op rounds the residual to the input dtype before normalising it; the float64
    # reference does not. A faithful rounding of that residual (< 1 ULP of it, up to 2 ULPs
    # of the output where the two sit at opposite ends of their binades) plus a faithful
    # rounding of the output stays under 3 ULPs; native's own error there is up to 1.5.
    "fused_add_rms_norm": {"floor_ulps": {"float16": 3.1, "bfloat16": 3.1}},
}


@dataclasses.dataclass(frozen=True)
class Budget:
    factor: float
    floor_ulps: float
    source: str  # "op", "suite" or "default": where the numbers came from

    def allowed(self, native_peak_ulp: float) -> float:
        """The largest peak ULP error a provider may have where native's is given."""
        return max(self.factor * native_peak_ulp, self.floor_ulps)


def budget_for(op: Any, dtype: str) -> Budget:
    """The budget of ``op`` (an op object) in ``dtype`` (a name such as ``"bfloat16"``)."""
    declared = irapi.error_budget(op, dtype)
    if declared is not None:
        factor, floor = _checked(declared, f"op {op.name!r} error_budget({dtype})")
        return Budget(factor, floor, "op")
    entry = OP_BUDGETS.get(op.name)
    floor_default = DEFAULT_FLOOR_ULPS.get(dtype, FALLBACK_FLOOR_ULPS)
    if entry is not None:
        floor = entry.get("floor_ulps", {}).get(dtype, floor_default)
        factor, floor = _checked(
            (entry.get("factor", DEFAULT_FACTOR), floor), f"OP_BUDGETS[{op.name!r}]"
        )
        return Budget(factor, floor, "suite")
    return Budget(DEFAULT_FACTOR, floor_default, "default")


def _checked(pair: Any, where: str) -> tuple[float, float]:
    try:
        factor, floor = (float(v) for v in pair)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected (factor, floor_ulps), got {pair!r}") from None
    if not (math.isfinite(factor) and factor >= 1 and math.isfinite(floor) and floor > 0):
        raise ValueError(
            f"{where}: factor must be a finite number >= 1 and floor_ulps a finite "
            f"number > 0; got ({factor:g}, {floor:g})"
        )
    return factor, floor
