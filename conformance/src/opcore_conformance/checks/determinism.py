"""``determinism[op-provider-dtype-sample]``: the same inputs give bitwise the same
outputs twice (two fresh device copies of one sample, the provider forced)."""

from __future__ import annotations

from typing import Any

from opcore_conformance.case import CheckFailed
from opcore_conformance.checks._op_grid import call, device_sample, forced, grid
from opcore_conformance.tensors import bitwise_equal, iter_tensors

CHECK = "determinism"


def collect(ctx) -> list:
    return list(grid(ctx, CHECK, _body))


def _body(op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        outs = []
        for _ in range(2):
            op, _, args, kwargs = device_sample(ctx, op_name, dtype, sample_name)
            with forced(op, provider, args, kwargs):
                outs.append(call(f"{op_name} with provider {provider!r}", op, *args, **kwargs))
        ctx.platform.synchronize()
        diffs = [
            p
            for (p, x), (_, y) in zip(iter_tensors(outs[0]), iter_tensors(outs[1]), strict=False)
            if (x is None) != (y is None)
            or (x is not None and y is not None and not bitwise_equal(x, y))
        ]
        if diffs:
            raise CheckFailed(
                f"{op_name} with provider {provider!r} gave different bits on two "
                f"runs of the same inputs in {', '.join(diffs)}"
            )
        return {}

    return body
