"""``numerics[op-provider-dtype-sample]``: each provider against the native reference.

Inputs come from the op's generator on the CPU (fixed seed) and are copied to the device
with their layout. The provider runs through the op's default overload (its priority forced
to that provider). The reference is the native function on the CPU in float64 from the same
inputs, rounded to the output dtype; the structure, shape, dtype and device of every output
are checked against the native function run in the input dtype. The bound is
``|out - ref| <= atol + rtol * |ref|`` with the op's per-dtype tolerance (or the
expectations file's loosened one).
"""

from __future__ import annotations

from typing import Any

import torch

from opcore_conformance.case import CheckFailed, Tolerance
from opcore_conformance.checks._op_grid import call, device_sample, forced, grid
from opcore_conformance.tensors import compare, iter_tensors, upcast

CHECK = "numerics"


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
    raise RuntimeError(f"the native {op.name} fails on upcast inputs: {type(last).__name__}: {last}")


def _body(op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, tol: Tolerance) -> dict[str, Any]:
        op, sample, args, kwargs = device_sample(ctx, op_name, dtype, sample_name)
        expected = op.native(*sample.args, **dict(sample.kwargs))  # shapes and dtypes
        ref, ref_dtype = reference(op, sample)
        with forced(op, provider, args, kwargs):
            out = call(f"{op_name} with provider {provider!r}", op, *args, **kwargs)
        ctx.platform.synchronize()
        return check_outputs(ctx, out, expected, ref, tol, ref_dtype=ref_dtype)

    return body


def check_outputs(ctx, out: Any, expected: Any, ref: Any, tol: Tolerance, *, ref_dtype: str) -> dict[str, Any]:
    got = list(iter_tensors(out))
    want = list(iter_tensors(expected))
    refs = list(iter_tensors(ref))
    if [p for p, _ in got] != [p for p, _ in want]:
        raise CheckFailed(f"output structure {[p for p, _ in got]} differs from the native "
                          f"function's {[p for p, _ in want]}")
    metrics: dict[str, Any] = {"atol": tol.atol, "rtol": tol.rtol, "ref_dtype": ref_dtype,
                               "ref_device": "cpu", "max_abs": 0.0, "max_rel": 0.0,
                               "max_ratio": 0.0, "mismatched": 0, "numel": 0}
    problems = []
    for (path, o), (_, w), (_, r) in zip(got, want, refs, strict=False):
        if w is None or o is None:
            if (w is None) != (o is None):
                problems.append(f"{path} is {'None' if o is None else 'a tensor'}, native gives "
                                f"{'None' if w is None else 'a tensor'}")
            continue
        if not isinstance(o, torch.Tensor):
            problems.append(f"{path} is {type(o).__name__}, expected a tensor")
            continue
        if tuple(o.shape) != tuple(w.shape):
            problems.append(f"{path} has shape {tuple(o.shape)}, expected {tuple(w.shape)}")
            continue
        if o.dtype != w.dtype:
            problems.append(f"{path} has dtype {str(o.dtype).removeprefix('torch.')}, expected "
                            f"{str(w.dtype).removeprefix('torch.')}")
        if o.device.type != ctx.device.type:
            problems.append(f"{path} is on {o.device}, expected {ctx.device}")
        rounded = r.to(w.dtype).to(torch.float64) if w.is_floating_point() else r
        m = compare(o, rounded, tol.atol, tol.rtol)
        metrics["numel"] += m["numel"]
        metrics["mismatched"] += m["mismatched"]
        for key in ("max_abs", "max_rel"):
            metrics[key] = max(metrics[key], m[key])
        if m["max_ratio"] >= metrics["max_ratio"]:
            metrics["max_ratio"] = m["max_ratio"]
            metrics["worst"] = {"output": path, "index": m.get("worst_index"),
                                "value": m.get("worst_value"), "reference": m.get("worst_reference")}
        if m["mismatched"]:
            w_ = m
            problems.append(
                f"{path}: {m['mismatched']}/{m['numel']} elements exceed atol={tol.atol:g} "
                f"rtol={tol.rtol:g} (max abs {m['max_abs']:.3g}, max rel {m['max_rel']:.3g}, "
                f"worst at {tuple(w_['worst_index'])}: {w_['worst_value']:.6g} vs reference "
                f"{w_['worst_reference']:.6g})"
            )
    if problems:
        raise CheckFailed("; ".join(problems), metrics)
    return metrics
