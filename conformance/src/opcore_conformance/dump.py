"""``--dump DIR``: one folder per ``numerics`` case with everything needed to see its
result again without the suite.

``DIR/<case id made safe for a file name>/`` holds

- ``inputs.pt``: ``{"args": ..., "kwargs": ...}``, the sample on the CPU as generated
  (strides, offsets and shared storage kept by `torch.save`);
- ``reference.pt``: the float64 reference (the native function on the CPU);
- ``output.pt``: the provider's outputs, copied to the CPU (absent when it raised);
- ``native.pt``: native's outputs on the same inputs and device, copied to the CPU;
- ``case.json``: the case id, op, provider, dtype, device, tolerance, error budget, the
  status and message the suite gave, and the metrics it measured;
- ``repro.py``: a standalone script (torch only; it does not import the suite) that loads
  the files, recomputes the tolerance check and the ULP errors with its own code, prints
  where the output departs from the reference next to native's error, and exits 1 when the
  case fails. ``python repro.py --run`` computes the provider's output again through
  ``opcore`` (on this machine, with the provider's plugin installed) instead of loading it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from opcore_conformance.tensors import ULP_MAGNITUDE_FLOOR, map_tensors

SCRIPT_NAME = "repro.py"


def folder_name(case_id: str) -> str:
    """A file-system-safe name for a case id: ``numerics[a-b-c]`` -> ``numerics_a-b-c``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", case_id).strip("_")


def _cpu(obj: Any) -> Any:
    return map_tensors(obj, lambda t: t.detach().to("cpu"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf/nan
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write(
    base: str | Path,
    *,
    case_id: str,
    op: str,
    provider: str,
    dtype: str,
    device: str,
    sample: Any,
    reference: Any,
    output: Any,
    native: Any,
    tolerance: Any,
    budget: Any,
    status: str,
    message: str,
    metrics: dict[str, Any],
    environment: dict[str, str],
) -> Path:
    """Write the dump of one case under ``base``; returns its folder."""
    folder = Path(base) / folder_name(case_id)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"args": tuple(sample.args), "kwargs": dict(sample.kwargs)}, folder / "inputs.pt")
    torch.save(_cpu(reference), folder / "reference.pt")
    torch.save(_cpu(native), folder / "native.pt")
    out_file = folder / "output.pt"
    if output is not None:
        torch.save(_cpu(output), out_file)
    elif out_file.exists():
        out_file.unlink()  # a stale output of an earlier dump would be read as this one's
    meta = {
        "case": case_id,
        "op": op,
        "provider": provider,
        "dtype": dtype,
        "device": device,
        "atol": tolerance.atol,
        "rtol": tolerance.rtol,
        "budget_factor": getattr(budget, "factor", None),
        "budget_floor_ulps": getattr(budget, "floor_ulps", None),
        "ulp_magnitude_floor": ULP_MAGNITUDE_FLOOR,
        "status": status,
        "message": message,
        "metrics": _jsonable(metrics),
        "environment": environment,
        "torch": torch.__version__,
    }
    (folder / "case.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (folder / SCRIPT_NAME).write_text(SCRIPT, encoding="utf-8")
    return folder


# The standalone script. It repeats the suite's definitions on purpose (the tolerance bound
# against the reference rounded to the output dtype; ULPs of the output dtype against the
# float64 reference, at no less than a fraction of the output's RMS; the budget
# max(factor x native's peak, floor)), so that it runs where only torch is installed; a
# self-test checks its numbers against the suite's.
SCRIPT = r'''#!/usr/bin/env python3
"""Reproduce one opcore conformance case from the files beside this script.

    python repro.py          compare the saved provider output with the saved reference
    python repro.py --run    compute the provider's output again through opcore first

Needs torch only (and opcore with the provider's plugin for --run); it does not import the
conformance suite. Exit status: 1 when the output breaks the tolerance or the error budget,
0 when it conforms. case.json says which case this is and what the suite measured.
"""

import json
import math
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
META = json.loads((HERE / "case.json").read_text(encoding="utf-8"))


def load(name):
    return torch.load(HERE / name, weights_only=True)


def tensors(obj, path="out"):
    """(path, tensor or None) for every output, in the order the op returns them."""
    if obj is None or isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, (tuple, list)):
        for i, o in enumerate(obj):
            yield from tensors(o, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, o in obj.items():
            yield from tensors(o, f"{path}[{k!r}]")


def ulp_errors(out, ref, dtype):
    """|out - ref| in ULPs of dtype, against the unrounded float64 reference."""
    o = out.detach().double().reshape(-1)
    r = ref.detach().double().reshape(-1)
    finite = torch.isfinite(o) & torch.isfinite(r)
    agree = (torch.isnan(o) & torch.isnan(r)) | (torch.isinf(o) & (o == r))
    fr = torch.where(finite, r, torch.zeros_like(r))
    rms = float(fr.pow(2).mean().sqrt()) if fr.numel() else 0.0
    at = fr.abs().clamp_min(META["ulp_magnitude_floor"] * rms)
    info = torch.finfo(dtype)
    _, exp = torch.frexp(at)
    ulp = torch.where(at >= info.smallest_normal,
                      torch.ldexp(torch.full_like(at, info.eps), (exp - 1).double()),
                      torch.full_like(at, info.smallest_normal * info.eps))
    err = torch.where(finite, (o - r).abs(), torch.zeros_like(r)) / ulp
    return torch.where(finite | agree, err, torch.full_like(r, math.inf))


def tolerance_check(out, ref, atol, rtol):
    """(elements over atol + rtol*|ref|, worst err/tol, worst index, value, reference)."""
    o, r = out.detach().double(), ref.detach().double()
    bad_nonfinite = (torch.isnan(r) != torch.isnan(o)) | (
        (torch.isinf(r) | torch.isinf(o)) & ~(torch.isnan(r) | torch.isnan(o)) & (o != r))
    finite = torch.isfinite(r) & torch.isfinite(o)
    diff = torch.where(finite, (o - r).abs(), torch.zeros_like(r))
    bound = atol + rtol * r.abs()
    ratio = torch.where(finite, diff / bound.clamp_min(1e-300), torch.zeros_like(r))
    ratio = torch.where(bad_nonfinite, torch.full_like(r, math.inf), ratio)
    if ratio.numel() == 0:
        return 0, 0.0, (), 0.0, 0.0
    flat = int(torch.argmax(ratio.reshape(-1)))
    index = (
        tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), r.shape)) if r.dim() else ()
    )
    over = int(((ratio > 1) | bad_nonfinite).sum())
    return over, float(ratio.max()), index, float(o.reshape(-1)[flat]), float(r.reshape(-1)[flat])


def move(obj, device):
    """A copy on device keeping each tensor's strides, offset and shared storage."""
    copies = {}

    def one(t):
        key = t.untyped_storage().data_ptr()
        if key not in copies:
            raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
            copies[key] = raw.to(device)
        return copies[key].view(t.dtype).as_strided(t.size(), t.stride(), t.storage_offset())

    if isinstance(obj, torch.Tensor):
        return one(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(move(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: move(v, device) for k, v in obj.items()}
    return obj


def run_provider(inputs):
    # the variables the run had (OPCORE_PLATFORM, TRITON_INTERPRET, ...), unless set here
    for key, value in META["environment"].items():
        os.environ.setdefault(key, value)
    import opcore.ir
    import opcore.plugins

    opcore.plugins.load_general_plugins()
    load = getattr(opcore.ir, "ensure_kernels_loaded", None)
    if load is None:  # an opcore from before it was exported there
        from opcore.ir.priority import ensure_kernels_loaded as load
    load()
    all_ops = getattr(opcore.ir, "all_ops", None)
    if all_ops is None:
        from opcore.ir import all_ops
    op = all_ops()[META["op"]]
    provider = META["provider"]
    args = move(inputs["args"], META["device"])
    kwargs = move(inputs["kwargs"], META["device"])
    order = [provider] if provider == "native" else [provider, "native"]
    with op.set_priority(order):
        chosen = op.dispatch(*args, **kwargs).provider
        if chosen != provider:
            sys.exit(f"provider {provider!r} declines these inputs here (opcore chose {chosen!r})")
        return op(*args, **kwargs)


def main(argv):
    print(f"case {META['case']}: {META['op']} with provider {META['provider']!r} in "
          f"{META['dtype']} on {META['device']}")
    print(f"the suite said: {META['status']}" + (f": {META['message']}" if META["message"] else ""))
    inputs, reference, native = load("inputs.pt"), load("reference.pt"), load("native.pt")
    if "--run" in argv:
        output = run_provider(inputs)
    elif (HERE / "output.pt").exists():
        output = load("output.pt")
    else:
        print("no saved provider output (it raised); run with --run to call it again")
        return 1
    want_dtype = getattr(torch, META["dtype"])
    atol, rtol = META["atol"], META["rtol"]
    factor, floor = META["budget_factor"], META["budget_floor_ulps"]
    failed = False
    outs, refs, nats = list(tensors(output)), list(tensors(reference)), list(tensors(native))
    if [p for p, _ in outs] != [p for p, _ in refs]:
        print(f"outputs {[p for p, _ in outs]}, the reference has {[p for p, _ in refs]}")
        print("FAIL")
        return 1
    nats += [(p, None) for p, _ in outs[len(nats):]]  # native raised: nothing to set beside
    for (path, o), (_, r), (_, n) in zip(outs, refs, nats, strict=False):
        if o is None or r is None:
            continue
        o = o.detach().cpu()
        dtype = n.dtype if n is not None else want_dtype
        if o.dtype != dtype or o.shape != r.shape:
            print(
                f"{path}: dtype {o.dtype} shape {tuple(o.shape)}, "
                f"expected {dtype} {tuple(r.shape)}"
            )
            failed = True
            continue
        if dtype.is_floating_point and dtype.itemsize == 1:
            # fp8 codes against the (quantized) reference, code by code (the suite's rule)
            def ordinal(t):
                bits = t.contiguous().view(torch.uint8).reshape(-1).to(torch.int64)
                return torch.where(bits >= 0x80, -(bits & 0x7F), bits & 0x7F)

            steps = (ordinal(o) - ordinal(r.to(dtype))).abs()
            nan_o, nan_r = torch.isnan(o.float()).reshape(-1), torch.isnan(r.float()).reshape(-1)
            steps = torch.where(nan_o == nan_r, torch.where(nan_o, 0, steps), 1 << 20)
            max_codes = META["metrics"].get("fp8_max_codes", 0)
            fraction = META["metrics"].get("fp8_fraction", 0.0)
            expected = fraction * steps.numel()
            allowed = math.ceil(expected + 3 * math.sqrt(expected)) if fraction > 0 else 0
            off, peak = int((steps > 0).sum()), int(steps.max()) if steps.numel() else 0
            print(f"{path}: {off}/{steps.numel()} fp8 values off the reference, peak {peak} "
                  f"code(s); the op allows {max_codes} code(s) on {allowed} of them")
            failed |= peak > max_codes or off > allowed
            continue
        if not dtype.is_floating_point:
            same = torch.equal(o, r.to(dtype))
            print(f"{path}: {'equal to' if same else 'DIFFERS from'} the reference")
            failed |= not same
            continue
        rounded = r.to(dtype)
        over, ratio, index, value, expect = tolerance_check(o, rounded, atol, rtol)
        mine = ulp_errors(o, r, dtype)
        theirs = ulp_errors(n.cpu(), r, dtype) if n is not None else torch.zeros(0)
        peak = float(mine.max()) if mine.numel() else 0.0
        native_peak = float(theirs.max()) if theirs.numel() else 0.0
        print(f"{path}: {over}/{o.numel()} elements over atol={atol:g} rtol={rtol:g}; "
              f"worst err/tol {ratio:.3g} at {index}: {value:.6g} vs reference {expect:.6g}")
        print(f"{path}: peak error {peak:.3g} ULP ({(mine > 1).double().mean().item() * 100:.3g} % "
              f"over 1 ULP); native on the same inputs {native_peak:.3g} ULP")
        if over:
            failed = True
        if factor is not None and META["provider"] != "native":
            allowed = max(factor * native_peak, floor)
            verdict = "over" if peak > allowed else "within"
            print(
                f"{path}: {verdict} the error budget "
                f"max({factor:g} x {native_peak:.3g}, {floor:g}) = {allowed:.3g} ULP"
            )
            failed |= peak > allowed
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''
