"""Layer checks (filled in below once `opcore.layers` is importable)."""

from __future__ import annotations

from opcore_conformance import status as S
from opcore_conformance.case import Case, case_id

CHECK = "layers"


def collect(ctx) -> list[Case]:
    try:
        import opcore.layers  # noqa: F401
    except ImportError as exc:
        return [Case(case_id(CHECK), CHECK, preset=S.NOT_APPLICABLE,
                     preset_reason=f"opcore.layers is not importable: {exc}")]
    return []
