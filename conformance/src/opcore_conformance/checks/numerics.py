"""``numerics[op-provider-dtype-sample]``: each provider against the native reference.

Inputs come from the op's generator on the CPU (seeded from the sample's name) and are
copied to the device with their layout. The provider runs through the op's default overload
(its priority forced to that provider). The reference is the native function on the CPU in
float64 from the same inputs; the structure, shape, dtype and device of every output are
checked against the native function run in the input dtype. Two bounds, both must hold:

- the tolerance: ``|out - ref| <= atol + rtol * |ref|`` elementwise, ``ref`` rounded to the
  output dtype, with the op's per-dtype tolerance (or the expectations file's loosened one);
- the error budget (`opcore_conformance.budgets`): ``native`` runs on the same inputs and
  device, both are measured in ULPs of the output dtype against the float64 reference, and
  the provider's peak may not exceed ``max(factor x native's peak, floor_ulps)``.

Integer outputs (the routers' expert ids) have neither: they must equal the reference
exactly.

The metrics carry both sides: the provider's ``max_ratio`` (err/tol), ``peak_ulp``,
``p99_ulp``, ``over_1ulp``, and native's as ``native_*``, so a report shows them side by side.

fp8 outputs (the quantization ops' codes) are compared code by code instead: the float64
reference is itself quantized (the native function on float64 inputs returns fp8), so the
distance is how many fp8 values apart the two are (`tensors.fp8_code_distance`, one code
= one e4m3 ULP). The op's fp8 tolerance (``opcore.ir.tolerances.fp8_tolerance``: at most
``max_codes`` apart, and apart at all on at most ``fraction`` of the elements, plus a
three-sigma margin for small samples: `tensors.fp8_allowed_off`) replaces
both bounds above for them; its other outputs (float32 scales, residual sums) are checked
as any output. Metrics: ``fp8_peak_codes``, ``fp8_off_fraction`` and native's.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from opcore_conformance import irapi
from opcore_conformance.budgets import Budget, budget_for
from opcore_conformance.case import CheckFailed, Tolerance, case_id
from opcore_conformance.checks._op_grid import call, device_sample, forced, grid
from opcore_conformance.tensors import (
    compare,
    fp8_allowed_off,
    fp8_code_distance,
    is_fp8,
    iter_tensors,
    to_device,
    ulp_error,
    ulp_summary,
    upcast,
)

CHECK = "numerics"
NATIVE = "native"


def collect(ctx) -> list:
    return list(grid(ctx, CHECK, _body, with_tolerance=True))


def reference(op: Any, sample: Any) -> tuple[Any, str]:
    """The native function in float64 on the CPU; float32 when the native function refuses
    float64 (recorded as the reference dtype)."""
    for dt in (torch.float64, torch.float32):
        args, kwargs = upcast((sample.args, dict(sample.kwargs)), dt)
        try:
            return op.native(*args, **kwargs), str(dt).removeprefix("torch.")
        except Exception as exc:
            last = exc
    raise RuntimeError(
        f"the native {op.name} fails on upcast inputs: {type(last).__name__}: {last}"
    )


def _body(op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, tol: Tolerance) -> dict[str, Any]:
        op, sample, args, kwargs = device_sample(ctx, op_name, dtype, sample_name)
        expected = op.native(*sample.args, **dict(sample.kwargs))  # shapes and dtypes
        ref, ref_dtype = reference(op, sample)
        budget = budget_for(op, dtype)
        dump = _dumper(ctx, op_name, provider, dtype, sample, ref, tol, budget)
        # native on the same inputs and device: what the reference math gives here
        native_out = None if provider == NATIVE else _native_here(ctx, op, sample)
        out = None
        try:
            with forced(op, provider, args, kwargs):
                out = call(f"{op_name} with provider {provider!r}", op, *args, **kwargs)
            ctx.platform.synchronize()
            native_out = out if native_out is None else native_out
            metrics = check_outputs(
                ctx,
                out,
                expected,
                ref,
                tol,
                ref_dtype=ref_dtype,
                native=native_out,
                budget=budget,
                provider=provider,
                fp8_tolerance=irapi.fp8_tolerance(op, dtype),
            )
        except CheckFailed as exc:
            dump(out, native_out, "fail", str(exc), exc.metrics)
            raise
        dump(out, native_out, "pass", "", metrics)
        return metrics

    return body


def _native_here(ctx, op: Any, sample: Any) -> Any:
    """The native provider's outputs on a fresh device copy of the sample."""
    args, kwargs = to_device((sample.args, dict(sample.kwargs)), ctx.device)
    with forced(op, NATIVE, args, kwargs):
        out = call(
            f"{op.name} with provider 'native' on {ctx.device} (the error budget's baseline)",
            op,
            *args,
            **kwargs,
        )
    ctx.platform.synchronize()
    return out


def _dumper(
    ctx,
    op_name: str,
    provider: str,
    dtype: str,
    sample: Any,
    ref: Any,
    tol: Tolerance,
    budget: Budget,
):
    """``dump(output, native_output, status, message, metrics)``: writes the case's dump
    folder when the run asked for one (``--dump DIR``), else does nothing."""
    base = getattr(ctx.options, "dump", None)

    def dump(out: Any, native_out: Any, status: str, message: str, metrics: dict[str, Any]) -> None:
        if base is None:
            return
        from opcore_conformance import dump as D

        env = {
            k: v
            for k, v in os.environ.items()
            if k.startswith("OPCORE_") or k == "TRITON_INTERPRET"
        }
        D.write(
            base,
            case_id=case_id(CHECK, op_name, provider, dtype, sample.name),
            op=op_name,
            provider=provider,
            dtype=dtype,
            device=str(ctx.device),
            sample=sample,
            reference=ref,
            output=out,
            native=native_out,
            tolerance=tol,
            budget=budget,
            status=status,
            message=message,
            metrics=metrics,
            environment=env,
        )

    return dump


def check_outputs(
    ctx,
    out: Any,
    expected: Any,
    ref: Any,
    tol: Tolerance,
    *,
    ref_dtype: str,
    native: Any = None,
    budget: Budget | None = None,
    provider: str = "",
    fp8_tolerance: tuple[int, float] = (0, 0.0),
) -> dict[str, Any]:
    """Check ``out`` against ``expected`` (structure, shape, dtype, device) and ``ref`` (the
    tolerance); with ``native`` (native's outputs on the same inputs) and ``budget``, also
    the error budget. fp8 outputs against ``fp8_tolerance`` (``(max_codes, fraction)``).
    Returns the metrics; raises `CheckFailed` with them."""
    got = list(iter_tensors(out))
    want = list(iter_tensors(expected))
    refs = list(iter_tensors(ref))
    natives = list(iter_tensors(native)) if native is not None else [(p, None) for p, _ in got]
    if [p for p, _ in got] != [p for p, _ in want]:
        raise CheckFailed(
            f"output structure {[p for p, _ in got]} differs from the native "
            f"function's {[p for p, _ in want]}"
        )
    metrics: dict[str, Any] = {
        "atol": tol.atol,
        "rtol": tol.rtol,
        "ref_dtype": ref_dtype,
        "ref_device": "cpu",
        "max_abs": 0.0,
        "max_rel": 0.0,
        "max_ratio": 0.0,
        "mismatched": 0,
        "numel": 0,
    }
    ulps: list[torch.Tensor] = []
    native_ulps: list[torch.Tensor] = []
    native_ratio = 0.0
    problems = []
    over_budget = []
    for (path, o), (_, w), (_, r), (_, n) in zip(got, want, refs, natives, strict=False):
        if w is None or o is None:
            if (w is None) != (o is None):
                problems.append(
                    f"{path} is {'None' if o is None else 'a tensor'}, native gives "
                    f"{'None' if w is None else 'a tensor'}"
                )
            continue
        if not isinstance(o, torch.Tensor):
            problems.append(f"{path} is {type(o).__name__}, expected a tensor")
            continue
        if r is None:
            problems.append(f"{path}: the fp64 reference gives None where native gives a tensor")
            continue
        if tuple(o.shape) != tuple(w.shape):
            problems.append(f"{path} has shape {tuple(o.shape)}, expected {tuple(w.shape)}")
            continue
        if o.dtype != w.dtype:
            problems.append(
                f"{path} has dtype {str(o.dtype).removeprefix('torch.')}, expected "
                f"{str(w.dtype).removeprefix('torch.')}"
            )
        if o.device.type != ctx.device.type:
            problems.append(f"{path} is on {o.device}, expected {ctx.device}")
        if is_fp8(w.dtype):
            if o.dtype == w.dtype and r.dtype == w.dtype:
                problems += _fp8_output(path, o, r, n, fp8_tolerance, metrics, ulps, native_ulps)
            elif o.dtype == w.dtype:
                problems.append(f"{path}: the fp64 reference is {r.dtype}, not {w.dtype}")
            continue
        rounded = r.to(w.dtype).to(torch.float64) if w.is_floating_point() else r
        # integer outputs (expert ids, indices) must equal the reference exactly: a
        # tolerance scaled by |ref| would let id 255 pass as 252
        exact = not w.is_floating_point()
        m = compare(o, rounded, 0.0 if exact else tol.atol, 0.0 if exact else tol.rtol)
        metrics["numel"] += m["numel"]
        metrics["mismatched"] += m["mismatched"]
        for key in ("max_abs", "max_rel"):
            metrics[key] = max(metrics[key], m[key])
        if m["max_ratio"] >= metrics["max_ratio"]:
            metrics["max_ratio"] = m["max_ratio"]
            metrics["worst"] = {
                "output": path,
                "index": m.get("worst_index"),
                "value": m.get("worst_value"),
                "reference": m.get("worst_reference"),
            }
        if m["mismatched"]:
            w_ = m
            bound = (
                "differ (integers: exact)"
                if exact
                else (f"exceed atol={tol.atol:g} rtol={tol.rtol:g}")
            )
            problems.append(
                f"{path}: {m['mismatched']}/{m['numel']} elements {bound} "
                f"(max abs {m['max_abs']:.3g}, max rel {m['max_rel']:.3g}, "
                f"worst at {tuple(w_['worst_index'])}: {w_['worst_value']:.6g} vs reference "
                f"{w_['worst_reference']:.6g})"
            )
        if not w.is_floating_point() or o.dtype != w.dtype:
            continue
        # Error in ULPs of the output dtype, the provider's and native's on the same inputs.
        e = ulp_error(o, r, w.dtype)
        ulps.append(e)
        if n is None or not isinstance(n, torch.Tensor) or tuple(n.shape) != tuple(w.shape):
            continue
        ne = ulp_error(n, r, w.dtype)
        native_ulps.append(ne)
        native_ratio = max(native_ratio, compare(n, rounded, tol.atol, tol.rtol)["max_ratio"])
        if budget is not None and provider != NATIVE:
            mine, theirs = ulp_summary(e), ulp_summary(ne)
            allowed = budget.allowed(theirs["peak_ulp"])
            if mine["peak_ulp"] > allowed:
                over_budget.append(_budget_message(path, mine, theirs, budget, allowed, provider))
    if ulps:
        metrics.update(ulp_summary(torch.cat(ulps)))
    if native_ulps:
        metrics.update({f"native_{k}": v for k, v in ulp_summary(torch.cat(native_ulps)).items()})
        metrics["native_max_ratio"] = native_ratio
    if budget is not None:
        metrics.update(
            budget_factor=budget.factor,
            budget_floor_ulps=budget.floor_ulps,
            budget_source=budget.source,
        )
        if "native_peak_ulp" in metrics:
            metrics["ulp_budget"] = budget.allowed(metrics["native_peak_ulp"])
    problems += over_budget
    if problems:
        raise CheckFailed("; ".join(problems), metrics)
    return metrics


def _fp8_output(
    path: str,
    out: torch.Tensor,
    ref: torch.Tensor,
    native: Any,
    tolerance: tuple[int, float],
    metrics: dict[str, Any],
    ulps: list[torch.Tensor],
    native_ulps: list[torch.Tensor],
) -> list[str]:
    """Compare one fp8 output code by code with the (quantized) reference; update the
    metrics and the ULP lists (a code is one ULP of the fp8 format); return problems."""
    max_codes, fraction = tolerance
    steps = fp8_code_distance(out, ref)
    numel = steps.numel()
    if not numel:
        return []
    off = int((steps > 0).sum())
    peak = int(steps.max())
    metrics["numel"] += numel
    metrics["fp8_numel"] = metrics.get("fp8_numel", 0) + numel
    metrics["fp8_off"] = metrics.get("fp8_off", 0) + off
    metrics["fp8_off_fraction"] = metrics["fp8_off"] / metrics["fp8_numel"]
    metrics["fp8_peak_codes"] = max(metrics.get("fp8_peak_codes", 0), peak)
    metrics["fp8_max_codes"], metrics["fp8_fraction"] = max_codes, fraction
    ulps.append(steps.to(torch.float64))
    if isinstance(native, torch.Tensor) and native.shape == out.shape:
        nsteps = fp8_code_distance(native, ref)
        native_ulps.append(nsteps.to(torch.float64))
        metrics["native_fp8_off"] = metrics.get("native_fp8_off", 0) + int((nsteps > 0).sum())
    problems = []
    if peak > max_codes:
        bad = int((steps > max_codes).sum())
        metrics["mismatched"] += bad
        i = int(torch.argmax(steps))
        got = float(out.detach().to("cpu", torch.float32).reshape(-1)[i])
        want = float(ref.detach().to("cpu", torch.float32).reshape(-1)[i])
        problems.append(
            f"{path}: {bad}/{numel} fp8 values are more than {max_codes} code(s) from the "
            f"reference (worst {peak} codes at flat index {i}: {got:g} vs reference {want:g})"
        )
    allowed = fp8_allowed_off(numel, fraction)
    if off > allowed:
        problems.append(
            f"{path}: {off}/{numel} fp8 values ({off / numel:.2%}) differ from the reference; "
            f"the op allows {fraction:.2%} ({allowed} of {numel} with the small-sample "
            f"margin; one code each: a scale's rounding flips ties)"
        )
    return problems


def _budget_message(
    path: str, mine: dict, theirs: dict, budget: Budget, allowed: float, provider: str
) -> str:
    def stats(s: dict) -> str:
        return (
            f"peak {s['peak_ulp']:.3g} ULP, p99 {s['p99_ulp']:.3g}, "
            f"{100 * s['over_1ulp']:.3g} % of elements over 1 ULP"
        )

    return (
        f"{path}: {provider} is less accurate than native beyond the error budget: "
        f"{provider} {stats(mine)}; native on the same inputs {stats(theirs)}; allowed peak "
        f"{allowed:.3g} ULP = max({budget.factor:g} x native's {theirs['peak_ulp']:.3g}, "
        f"floor {budget.floor_ulps:g}) ({budget.source} budget)"
    )
