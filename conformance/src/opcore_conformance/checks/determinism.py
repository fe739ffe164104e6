"""``determinism[op-provider-dtype-sample]``: the same inputs give bitwise the same
outputs on repeated runs (fresh device copies of one sample, the provider forced: two in
quick mode, three in full mode).

The property ``deterministic`` (docs/properties.md): a provider that declares it fails when
the bits differ; one that does not is ``unsupported`` then, and passes with "could claim"
in its message when they agree (see `opcore_conformance.checks.properties.verdict`)."""

from __future__ import annotations

from typing import Any

from opcore_conformance import irapi
from opcore_conformance.checks._op_grid import call, device_sample, forced, grid
from opcore_conformance.checks.properties import verdict
from opcore_conformance.tensors import bitwise_equal, iter_tensors

CHECK = "determinism"
RUNS = {True: 2, False: 3}  # by ctx.quick


def collect(ctx) -> list:
    return list(grid(ctx, CHECK, _body))


def _body(op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        outs = []
        runs = RUNS[bool(ctx.quick)]
        for _ in range(runs):
            op, _, args, kwargs = device_sample(ctx, op_name, dtype, sample_name)
            with forced(op, provider, args, kwargs):
                outs.append(call(f"{op_name} with provider {provider!r}", op, *args, **kwargs))
        ctx.platform.synchronize()
        diffs = sorted(
            {
                p
                for other in outs[1:]
                for (p, x), (_, y) in zip(iter_tensors(outs[0]), iter_tensors(other), strict=False)
                if (x is None) != (y is None)
                or (x is not None and y is not None and not bitwise_equal(x, y))
            }
        )
        op = irapi.get_op(op_name)
        return verdict(
            "deterministic" in irapi.provider_properties(irapi.impls(op)[provider]),
            "deterministic",
            not diffs,
            f"{op_name} with provider {provider!r}",
            f"{runs} runs of the same inputs gave different bits in {', '.join(diffs)}",
            {"runs": runs},
        )

    return body
