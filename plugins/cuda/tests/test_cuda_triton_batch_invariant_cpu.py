"""Provider ``triton_batch_invariant`` (docs/properties.md) on the CPU under Triton's
interpreter: the conformance suite's numerics (every sample against the float64
reference, within the error budget) and batch-invariance check, fp32 and bf16.

A child process: the interpreter must be on before `opcore.kernels.triton` is first
imported. The cpu platform does not register the provider, so the run imports it
(``--import``), as a plugin author would.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
pytest.importorskip("opcore_conformance")


def test_batch_invariant_provider_passes_numerics_and_its_claim(interpreted_conformance):
    records = interpreted_conformance(
        "--import",
        "opcore.kernels.triton.batch_invariant",
        "--providers",
        "triton_batch_invariant",
        "--checks",
        "numerics,batch_invariance",
        "--dtypes",
        "float32,bfloat16",
        "--expectations",
        "none",
    )
    statuses: dict[tuple[str, str], int] = {}
    for rec in records:
        if rec.get("provider") == "triton_batch_invariant":
            key = (rec["check"], rec["status"])
            statuses[key] = statuses.get(key, 0) + 1
            if rec["check"] == "batch_invariance":
                assert rec["details"]["declared"] is True
    assert {s for _, s in statuses} == {"pass"}, statuses
    assert statuses[("batch_invariance", "pass")] == 6  # three ops x two dtypes
    assert statuses[("numerics", "pass")] > 100
