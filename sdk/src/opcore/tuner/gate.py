"""The correctness gate every tuning candidate passes before it is timed.

The rule is the conformance suite's numerics rule (its ``budgets`` module): outputs are
measured in ULPs of the output dtype against the op's native function computed in float64
(here on the tuning device: the arguments cast to float64), and a candidate fails when,
for any output,

    its peak ULP error > max(factor x native's peak ULP error, floor_ulps)

with native's peak measured on the same inputs in the working dtype. ``(factor,
floor_ulps)``: the op's own ``error_budget(dtype)`` when it declares one, else the
defaults below (the same numbers as the suite's; sdk/tests/test_tuning.py checks that the
two agree for every op and dtype). The core does not import the suite: the rule is short
and the test keeps the copies equal.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

DEFAULT_FACTOR = 2.0
DEFAULT_FLOOR_ULPS = {
    torch.float16: 1.1,
    torch.bfloat16: 1.1,
    torch.float32: 256.0,
    torch.float64: 256.0,
}
FALLBACK_FLOOR_ULPS = 1.1
# Per-op floors the suite declares for itself (its OP_BUDGETS): the op rounds an
# intermediate the float64 reference does not.
OP_FLOOR_ULPS = {"fused_add_rms_norm": {torch.float16: 3.1, torch.bfloat16: 3.1}}
MAGNITUDE_FLOOR = 1 / 16  # ULPs are taken at max(|ref|, this x rms(ref)), as in the suite


def budget(op: Any, dtype: torch.dtype) -> tuple[float, float]:
    """``(factor, floor_ulps)`` for ``op``'s outputs in ``dtype``."""
    declared = op.error_budget(dtype)
    if declared is not None:
        return float(declared[0]), float(declared[1])
    floors = OP_FLOOR_ULPS.get(op.name, {})
    return DEFAULT_FACTOR, floors.get(dtype, DEFAULT_FLOOR_ULPS.get(dtype, FALLBACK_FLOOR_ULPS))


def _ulp_of(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    _, exp = torch.frexp(magnitude)
    spacing = torch.ldexp(torch.full_like(magnitude, info.eps), (exp - 1).to(torch.float64))
    tiny = info.smallest_normal * info.eps
    return torch.where(magnitude >= info.smallest_normal, spacing, torch.full_like(magnitude, tiny))


CHUNK = 1 << 25  # elements per pass: bounds the float64 temporaries on large outputs


def peak_ulp(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> float:
    """Peak ``|out - ref|`` in ULPs of ``dtype`` (inf where non-finite values disagree),
    computed in chunks of `CHUNK` elements."""
    o_all, r_all = out.detach().reshape(-1), ref.detach().reshape(-1)
    if o_all.numel() != r_all.numel():
        return math.inf
    if o_all.numel() == 0:
        return 0.0
    n = o_all.numel()
    squares, count = 0.0, 0
    for i in range(0, n, CHUNK):
        r = r_all[i : i + CHUNK].to(torch.float64)
        fr = torch.where(torch.isfinite(r), r, torch.zeros_like(r))
        squares += float(fr.pow(2).sum())
        count += r.numel()
    rms = math.sqrt(squares / count)
    peak = 0.0
    for i in range(0, n, CHUNK):
        o = o_all[i : i + CHUNK].to(torch.float64)
        r = r_all[i : i + CHUNK].to(device=o.device, dtype=torch.float64)
        finite = torch.isfinite(o) & torch.isfinite(r)
        agree = (torch.isnan(o) & torch.isnan(r)) | (torch.isinf(o) & (o == r))
        if not bool((finite | agree).all()):
            return math.inf
        fr = torch.where(finite, r, torch.zeros_like(r))
        at = fr.abs().clamp_min(MAGNITUDE_FLOOR * rms)
        err = torch.where(finite, (o - r).abs(), torch.zeros_like(r)) / _ulp_of(at, dtype)
        peak = max(peak, float(err.max()))
    return peak


def outputs(value: Any) -> list[torch.Tensor | None]:
    """An op's return value as a list of outputs."""
    if isinstance(value, torch.Tensor) or value is None:
        return [value]
    return list(value)


def to_float64(args: tuple) -> tuple:
    """The arguments with every floating tensor cast to float64 (same device)."""
    return tuple(
        a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in args
    )


@dataclasses.dataclass
class Reference:
    """What a candidate is gated against: the float64 outputs and native's peak ULPs."""

    dtype: torch.dtype
    ref: list[torch.Tensor | None]
    native_peaks: list[float]
    factor: float
    floor: float

    def allowed(self) -> list[float]:
        return [max(self.factor * p, self.floor) for p in self.native_peaks]


def reference(op: Any, args: tuple, dtype: torch.dtype) -> Reference:
    """The float64 reference of ``op`` at ``args`` and native's error in ``dtype``."""
    ref = outputs(op.native(*to_float64(args)))
    native = outputs(op.native(*args))
    peaks = [
        0.0 if r is None or n is None else peak_ulp(n, r, dtype)
        for n, r in zip(native, ref, strict=True)
    ]
    factor, floor = budget(op, dtype)
    return Reference(dtype, ref, peaks, factor, floor)


@dataclasses.dataclass
class Verdict:
    ok: bool
    peaks: list[float]
    allowed: list[float]
    reason: str = ""


def check(reference_: Reference, value: Any) -> Verdict:
    """Gate one candidate's return value against ``reference_``."""
    outs = outputs(value)
    allowed = reference_.allowed()
    if len(outs) != len(reference_.ref):
        return Verdict(False, [], allowed, f"{len(outs)} outputs, expected {len(allowed)}")
    peaks: list[float] = []
    for i, (o, r) in enumerate(zip(outs, reference_.ref, strict=True)):
        if (o is None) != (r is None):
            return Verdict(False, peaks, allowed, f"output {i} is None on one side only")
        peaks.append(0.0 if o is None or r is None else peak_ulp(o, r, reference_.dtype))
    bad = [i for i, (p, a) in enumerate(zip(peaks, allowed, strict=True)) if not p <= a]
    if bad:
        i = bad[0]
        return Verdict(
            False,
            peaks,
            allowed,
            f"output {i}: peak {peaks[i]:.3g} ULP > allowed {allowed[i]:.3g} "
            f"(max({reference_.factor:g} x native's {reference_.native_peaks[i]:.3g}, "
            f"{reference_.floor:g}))",
        )
    return Verdict(True, peaks, allowed)
