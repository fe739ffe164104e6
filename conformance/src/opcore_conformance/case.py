"""The case model: one check of one thing, with a stable id, and what running it gave.

A case id is ``<check>[<part>-<part>-...]``, e.g.
``numerics[rms_norm-native-bfloat16-odd_hidden_4099]`` or ``platform.dtype[bfloat16]``.
Parts come from names (op, provider, dtype, the sample's
name from the op's generator), never from enumeration order, so the same installation always
yields the same ids, and one id always names the same inputs: each sample's draws are seeded
from its op's and its own name (`opcore.ir.samples.sample_seed`), in every mode and selection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from opcore_conformance import status as S


def case_id(check: str, *parts: object) -> str:
    """``check[p1-p2-...]``; ``check`` alone when there are no parts."""
    shown = [str(p) for p in parts if p is not None]
    return f"{check}[{'-'.join(shown)}]" if shown else check


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Elementwise bound ``|out - ref| <= atol + rtol * |ref|``."""

    atol: float
    rtol: float


@dataclasses.dataclass
class Outcome:
    """What one run of a check gave, before expectations are applied.

    ``status`` is one of pass / fail / error / skip / unsupported / not_applicable.
    ``metrics``: numbers for the report (``max_abs``, ``max_rel``, ``max_ratio`` (worst
    ``|d| / (atol + rtol |ref|)``, 1.0 is the bound), ``atol``, ``rtol``, ``ref_dtype``,
    ``ref_device``, ...; numerics adds the ULP errors of the provider and of native on the
    same inputs, ``peak_ulp`` / ``native_peak_ulp`` ..., and the error budget used).
    """

    status: str
    message: str = ""
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in S.ALL or self.status in (S.XFAIL, S.XPASS):
            raise ValueError(f"Outcome status {self.status!r} is not a raw check status")


class CheckFailed(AssertionError):
    """Raised inside a check body: the check ran and did not hold. Becomes ``fail``."""

    def __init__(self, message: str, metrics: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.metrics = dict(metrics or {})


class NotApplicable(Exception):
    """Raised inside a check body: the check cannot run here. Becomes ``not_applicable``."""


class Unsupported(Exception):
    """Raised inside a check body: the platform or provider does not claim this input.
    Becomes ``unsupported``."""


# A check body: called with the run context and the tolerance to use (the op's, or the
# expectations file's loosened one); returns metrics or raises CheckFailed / NotApplicable /
# Unsupported. Any other exception is ``error`` (the harness, or a broken generator).
Body = Callable[[Any, "Tolerance | None"], "dict[str, Any] | None"]


@dataclasses.dataclass
class Case:
    """One conformance case.

    ``body`` runs it. ``preset`` short-circuits it: a status decided at collection time
    (``unsupported`` for a dtype the platform does not claim, ``not_applicable``...),
    with ``preset_reason``. ``kernel_errors_fail``: an exception raised by ``body`` is
    the code under test failing (``fail``), not the harness (``error``); checks set this
    when the body's only non-trivial code is the kernel call.
    """

    id: str
    check: str
    body: Body | None = None
    op: str | None = None
    provider: str | None = None
    dtype: str | None = None
    sample: str | None = None
    layout: str | None = None
    preset: str | None = None
    preset_reason: str = ""
    default_tolerance: Tolerance | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def key(self) -> tuple[str, str, str, str]:
        """The summary-table row this case belongs to."""
        return (self.check, self.op or "", self.provider or "", self.dtype or "")


@dataclasses.dataclass
class Result:
    """A case after running and applying expectations: one JSONL record."""

    case: Case
    status: str
    raw_status: str
    message: str = ""
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    expected: str | None = None  # the expectations entry's status, when one matched
    expectation_reason: str | None = None
    expectation_entry: int | None = None
    tolerance_source: str = "op"
    duration_s: float = 0.0
    repro: str | None = None

    def to_record(self) -> dict[str, Any]:
        c = self.case
        rec: dict[str, Any] = {
            "type": "case",
            "id": c.id,
            "check": c.check,
            "op": c.op,
            "provider": c.provider,
            "dtype": c.dtype,
            "sample": c.sample,
            "layout": c.layout,
            "status": self.status,
            "raw_status": self.raw_status,
            "expected": self.expected,
            "reason": self.expectation_reason,
            "expectation_entry": self.expectation_entry,
            "message": self.message,
            "tolerance_source": self.tolerance_source,
            "duration_s": round(self.duration_s, 6),
            "repro": self.repro,
        }
        for key in (
            "max_abs",
            "max_rel",
            "max_ratio",
            "atol",
            "rtol",
            "ref_dtype",
            "ref_device",
            "mismatched",
            "numel",
        ):
            rec[key] = self.metrics.get(key)
        extra = {k: v for k, v in self.metrics.items() if k not in rec}
        if extra:
            rec["details"] = extra
        return rec
