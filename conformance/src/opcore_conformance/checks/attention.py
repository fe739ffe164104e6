"""``attention[<backend>-<case>]``: each attention backend the platform offers, against
``TORCH_NATIVE`` in float64 on the CPU.

The cases and the runner belong to ``opcore.attention.testing`` (``conformance_cases(quick)``,
``case_reasons``, ``run_case``); this module turns them into conformance cases. For each
case, the backends are the platform's candidates for that case's selector config; a
backend whose capability check rejects the case is ``unsupported`` with its reasons. With no
``opcore.attention`` installed there is one ``not_applicable`` case.
"""

from __future__ import annotations

import math
from typing import Any

from opcore_conformance import status as S
from opcore_conformance.case import Case, CheckFailed, Unsupported, case_id

CHECK = "attention"
OP = "attention"


def _testing() -> Any:
    import opcore.attention.testing as testing

    return testing


def collect(ctx) -> list[Case]:
    if not ctx.wants(op=OP):
        return []
    try:
        testing = _testing()
    except ImportError as exc:
        return [
            Case(
                case_id(CHECK),
                CHECK,
                op=OP,
                preset=S.NOT_APPLICABLE,
                preset_reason=f"opcore.attention.testing is not importable: {exc}",
            )
        ]
    claimed = {str(d).removeprefix("torch.") for d in ctx.platform.supported_dtypes}
    out = []
    for case in testing.conformance_cases(ctx.quick):
        cfg = case.selector_config(ctx.platform.device_type)
        backends = ctx.platform.get_attn_backend_candidates(cfg)
        dtype = str(case.dtype).removeprefix("torch.")
        for backend in backends:
            c = Case(
                case_id(CHECK, backend, case.name),
                CHECK,
                op=OP,
                provider=backend,
                dtype=dtype,
                sample=case.name,
                body=_body(backend, case),
            )
            if dtype not in claimed:
                c.preset = S.UNSUPPORTED
                c.preset_reason = f"platform {ctx.platform.name!r} does not claim {dtype}"
            out.append(c)
    return out


def _body(backend: str, case: Any):
    def body(ctx, _tol) -> dict[str, Any]:
        testing = _testing()
        reasons = testing.case_reasons(backend, case, ctx.device)
        if reasons:
            raise Unsupported(f"{backend} declines {case.name}: {'; '.join(reasons)}")
        try:
            r = testing.run_case(backend, case, ctx.device)
        except testing.CaseNotSupported as exc:
            raise Unsupported(str(exc)) from None
        except Exception as exc:
            raise CheckFailed(
                f"{backend} on {case.name} raised {type(exc).__name__}: {exc}"
            ) from None
        ratio = r.max_rel_err / r.rtol if r.rtol else (0.0 if r.max_rel_err == 0 else math.inf)
        metrics = {
            "max_abs": r.max_abs_err,
            "max_rel": r.max_rel_err,
            "max_ratio": ratio,
            "atol": r.atol,
            "rtol": r.rtol,
            "ref_dtype": "float64",
            "ref_device": "cpu",
            "reference": "TORCH_NATIVE",
        }
        if not r.passed:
            raise CheckFailed(
                f"{backend} differs from TORCH_NATIVE on {case.name}: max abs error "
                f"{r.max_abs_err:.3g}, worst |d|/(atol + rtol|ref|) = {ratio:.3g} > 1 "
                f"(atol={r.atol:g}, rtol={r.rtol:g})",
                metrics,
            )
        return metrics

    return body
