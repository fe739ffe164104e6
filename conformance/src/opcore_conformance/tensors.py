"""Moving sample inputs between devices without changing what they are, and comparing
outputs with a reference.

Inputs are generated on the CPU and copied to the device with their exact layout: strides,
storage offset, and which arguments share one storage (q, k, v as slices of one QKV
buffer stay slices of one device buffer). ``Tensor.to`` would make a non-dense tensor
contiguous and hide exactly the defects (rows read as if contiguous) this suite looks for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply ``fn`` to every tensor inside nested tuples/lists/dicts; keep the rest."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def iter_tensors(obj: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor | None]]:
    """``(path, tensor)`` for every tensor (and ``None`` slot) in nested outputs."""
    if isinstance(obj, torch.Tensor) or obj is None:
        yield path or "out", obj
    elif isinstance(obj, (tuple, list)):
        for i, o in enumerate(obj):
            yield from iter_tensors(o, f"{path or 'out'}[{i}]")
    elif isinstance(obj, dict):
        for k, o in obj.items():
            yield from iter_tensors(o, f"{path or 'out'}[{k!r}]")
    else:
        yield path or "out", obj  # a non-tensor output, compared by the caller


def to_device(obj: Any, device: torch.device | str) -> Any:
    """A copy of ``obj`` on ``device`` with every tensor's size, stride, storage offset and
    storage sharing preserved (always a fresh copy, also when ``device`` is the CPU)."""
    device = torch.device(device)
    copies: dict[int, torch.Tensor] = {}

    def move(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        raw = copies.get(key)
        if raw is None:
            src = torch.empty(0, dtype=torch.uint8).set_(storage)
            raw = torch.empty(src.numel(), dtype=torch.uint8, device=device)
            raw.copy_(src)
            copies[key] = raw
        typed = raw.view(t.dtype) if t.element_size() > 0 and raw.numel() else raw
        return typed.as_strided(t.size(), t.stride(), t.storage_offset())

    return map_tensors(obj, move)


def clone_preserving(obj: Any) -> Any:
    """A copy on the same device, layout and storage sharing preserved."""

    def first_device(o: Any) -> torch.device | None:
        for _, t in iter_tensors(o):
            if isinstance(t, torch.Tensor):
                return t.device
        return None

    device = first_device(obj)
    return obj if device is None else _clone_on(obj, device)


def _clone_on(obj: Any, device: torch.device) -> Any:
    copies: dict[int, torch.Tensor] = {}

    def copy(t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            key = storage.data_ptr()
        except (RuntimeError, NotImplementedError):
            # No storage to share on this device (XLA's lazy tensors): copy the values.
            return t.clone()
        raw = copies.get(key)
        if raw is None:
            src = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            raw = src.clone()
            copies[key] = raw
        return raw.view(t.dtype).as_strided(t.size(), t.stride(), t.storage_offset())

    return map_tensors(obj, copy)


def upcast(obj: Any, dtype: torch.dtype = torch.float64) -> Any:
    """Floating tensors to ``dtype`` (contiguous, on the CPU); others unchanged."""
    return map_tensors(
        obj,
        lambda t: t.detach().to("cpu", dtype) if t.is_floating_point() else t.detach().to("cpu"),
    )


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.is_floating_point() and a.element_size() in (1, 2, 4, 8):
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(view), b.view(view))
    return torch.equal(a, b)


def compare(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> dict[str, Any]:
    """Error metrics of ``out`` against ``ref`` (both brought to float64 on the CPU).

    NaN must sit where the reference has NaN; infinities must match exactly. Returns
    ``max_abs``, ``max_rel``, ``max_ratio`` (worst ``|d| / (atol + rtol |ref|)``),
    ``mismatched`` (elements over the bound, non-finite mismatches included), ``numel``,
    ``worst_index``.
    """
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    numel = r.numel()
    if numel == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "max_ratio": 0.0, "mismatched": 0, "numel": 0}
    r_nan, o_nan = torch.isnan(r), torch.isnan(o)
    r_inf, o_inf = torch.isinf(r), torch.isinf(o)
    nonfinite_bad = (r_nan != o_nan) | ((r_inf | o_inf) & ~(r_nan | o_nan) & (o != r))
    finite = torch.isfinite(r) & torch.isfinite(o)
    diff = torch.where(finite, (o - r).abs(), torch.zeros_like(r))
    bound = atol + rtol * r.abs()
    ratio = torch.where(
        finite,
        torch.where(
            bound > 0, diff / bound.clamp_min(1e-300), torch.where(diff > 0, math.inf, 0.0)
        ),
        torch.zeros_like(r),
    )
    ratio = torch.where(nonfinite_bad, torch.full_like(r, math.inf), ratio)
    rel = torch.where(finite & (r.abs() > 0), diff / r.abs().clamp_min(1e-300), torch.zeros_like(r))
    flat_idx = int(torch.argmax(ratio.reshape(-1)))
    worst = (
        tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_idx), r.shape))
        if r.dim()
        else ()
    )
    mismatched = int(((ratio > 1.0) | nonfinite_bad).sum())
    return {
        "max_abs": float(diff.max()),
        "max_rel": float(rel.max()),
        "max_ratio": float(ratio.max()),
        "mismatched": mismatched,
        "numel": numel,
        "worst_index": list(worst),
        "worst_value": float(o.reshape(-1)[flat_idx]),
        "worst_reference": float(r.reshape(-1)[flat_idx]),
    }


# Elements smaller than this fraction of their output's RMS are measured in ULPs at that
# magnitude: a result that is the small difference of large terms (x*cos - y*sin, a gate
# far in silu's tail) carries an error set by the terms, and its own ULP would make a
# rounding of the terms look like thousands of ULPs.
ULP_MAGNITUDE_FLOOR = 1 / 16


def ulp_of(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each value of ``magnitude`` (float64 on the CPU):
    ``2**(e - mantissa_bits)`` for ``|v|`` in ``[2**e, 2**(e+1))``; the subnormal spacing
    below the smallest normal (zero included)."""
    info = torch.finfo(dtype)
    r = magnitude.detach().to("cpu", torch.float64).abs()
    _, exp = torch.frexp(r)  # r = m * 2**exp with m in [0.5, 1)
    spacing = torch.ldexp(torch.full_like(r, info.eps), (exp - 1).to(torch.float64))
    subnormal = info.smallest_normal * info.eps
    return torch.where(r >= info.smallest_normal, spacing, torch.full_like(r, subnormal))


def ulp_error(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``|out - ref|`` in units in the last place of ``dtype``, elementwise (float64,
    flattened), against the float64 reference ``ref`` as computed (not rounded): a
    correctly rounded output scores at most 0.5, a faithfully rounded one (truncation
    included) under 1, and a kernel that loses precision more. The ULP is taken at
    ``max(|ref|, ULP_MAGNITUDE_FLOOR * rms(ref))``. Non-finite values: 0 where both agree
    (NaN with NaN, the same infinity), inf where not."""
    o = out.detach().to("cpu", torch.float64).reshape(-1)
    r = ref.detach().to("cpu", torch.float64).reshape(-1)
    finite = torch.isfinite(o) & torch.isfinite(r)
    same_nonfinite = (torch.isnan(o) & torch.isnan(r)) | (torch.isinf(o) & (o == r))
    fr = torch.where(finite, r, torch.zeros_like(r))
    rms = float(fr.pow(2).mean().sqrt()) if fr.numel() else 0.0
    at = fr.abs().clamp_min(ULP_MAGNITUDE_FLOOR * rms)
    err = torch.where(finite, (o - r).abs(), torch.zeros_like(r)) / ulp_of(at, dtype)
    return torch.where(finite | same_nonfinite, err, torch.full_like(r, math.inf))


def ulp_summary(errors: torch.Tensor) -> dict[str, float]:
    """``peak_ulp``, ``p99_ulp`` (99 % of the elements are at or under it) and
    ``over_1ulp`` (the fraction of elements more than one ULP off: not even faithfully
    rounded) of elementwise ULP errors; zeros for no elements."""
    n = errors.numel()
    if n == 0:
        return {"peak_ulp": 0.0, "p99_ulp": 0.0, "over_1ulp": 0.0}
    p99 = float(torch.kthvalue(errors.reshape(-1), max(1, math.ceil(0.99 * n))).values)
    return {
        "peak_ulp": float(errors.max()),
        "p99_ulp": p99,
        "over_1ulp": float((errors > 1.0).sum()) / n,
    }


def is_fp8(dtype: torch.dtype) -> bool:
    """A one-byte floating dtype (the float8 formats)."""
    return dtype.is_floating_point and dtype.itemsize == 1


def fp8_code_distance(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """How many representable values apart ``out`` and ``ref`` (one fp8 dtype) are,
    elementwise (int64, flattened, on the CPU). Both e4m3 formats are sign-magnitude
    bytes, so a code's magnitude bits order its values: adjacent values differ by one
    (+0 and -0 are the same point). NaN where the other is not: a distance of 2**20."""

    def ordinal(t: torch.Tensor) -> torch.Tensor:
        bits = t.detach().to("cpu").contiguous().view(torch.uint8).reshape(-1).to(torch.int64)
        mag = bits & 0x7F
        return torch.where(bits >= 0x80, -mag, mag)

    o, r = out.detach().to("cpu"), ref.detach().to("cpu")
    steps = (ordinal(o) - ordinal(r)).abs()
    o_nan = torch.isnan(o.to(torch.float32)).reshape(-1)
    r_nan = torch.isnan(r.to(torch.float32)).reshape(-1)
    steps = torch.where(o_nan & r_nan, torch.zeros_like(steps), steps)
    return torch.where(o_nan != r_nan, torch.full_like(steps, 1 << 20), steps)


def fp8_allowed_off(numel: int, fraction: float) -> int:
    """How many of ``numel`` fp8 values may differ from the reference under a declared
    ``fraction``: the expected count plus three standard deviations of a binomial count,
    rounded up, so a sample of a few dozen values is not failed for one tie that flipped
    (one of 8 values is 12.5 %), while a kernel that flips ties systematically still is."""
    expected = fraction * numel
    return math.ceil(expected + 3.0 * math.sqrt(expected)) if fraction > 0 else 0
