"""fp8 cases on a device that cannot hold fp8 tensors: ``not_applicable``, with the reason.

The quantization ops return fp8 tensors (`opcore.ir.quant.fp8_dtype`), and an op may take
them. A platform states its fp8 dtype as ``Platform.fp8_dtype``:

* declared: its fp8 cases run like any other. A device that declares a dtype and cannot
  hold it fails them, as it should.
* ``None``: the ops still produce ``float8_e4m3fn``, which many devices store and convert
  without computing in it (the CPU; NVIDIA GPUs before sm89, whose kernels encode the
  codes in integers). So the suite asks the device once: it converts a float32 tensor to
  that dtype and back. A device that cannot (the virtual device, whose dtypes are a fixed
  list) gets every fp8 case as ``not_applicable``. The reason names the platform, the
  dtype and the device's own error. Without this rule each case fails on its first fp8
  allocation, a thousand failures that say nothing about the providers.

An fp8 case is a case of an op whose sample holds an fp8 tensor, or whose outputs for the
case's dtype are fp8. The outputs are seen once per op and dtype, on its first sample, run
by the native function on the meta device (shapes and dtypes, no data), or on the CPU
where meta cannot run it. A case without a sample (``supports_args[op-provider]``) is an
fp8 case when any of its op's dtypes is. Cases already decided at collection
(``unsupported`` dtype or provider) keep their status.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from opcore_conformance import irapi
from opcore_conformance import status as S
from opcore_conformance.case import Case
from opcore_conformance.tensors import is_fp8, iter_tensors


def mark(ctx: Any, cases: list[Case]) -> list[Case]:
    """``cases`` with every fp8 case made ``not_applicable`` where the device cannot hold
    fp8 tensors (see the module doc); unchanged elsewhere. Never raises: a case whose op
    cannot be inspected runs as before and reports its own outcome."""
    missing = missing_reason(ctx)
    if missing is None:
        return cases
    seen = _Fp8Cases(ctx)
    for case in cases:
        if case.preset is None and case.op is not None and seen.touches(case):
            case.preset = S.NOT_APPLICABLE
            case.preset_reason = f"{case.op} takes or returns fp8 tensors: {missing}"
    return cases


def missing_reason(ctx: Any) -> str | None:
    """Why fp8 cases cannot run on ``ctx``'s device (``None``: they can)."""
    if getattr(ctx.platform, "fp8_dtype", None) is not None:
        return None  # declared: the platform answers for it (see the module doc)
    try:
        from opcore.ir.quant import fp8_dtype
    except ImportError:
        return None  # an opcore without fp8 ops has no fp8 cases
    dtype = fp8_dtype()
    error = _probe(str(ctx.device), dtype)
    if error is None:
        return None
    return (
        f"platform {ctx.platform.name!r} declares no fp8_dtype and device {ctx.device} "
        f"cannot hold {str(dtype).removeprefix('torch.')} tensors ({error})"
    )


@functools.cache
def _probe(device: str, dtype: torch.dtype) -> str | None:
    """The device's error converting float32 to ``dtype`` and back, or ``None``. Cached:
    one conversion per run (a device's abilities do not change within a process)."""
    try:
        torch.ones(2, device=device).to(dtype).to(torch.float32).cpu()
    except Exception as exc:  # whatever the device raises, it cannot hold the dtype
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first}"
    return None


class _Fp8Cases:
    """Which ops, dtypes and samples touch fp8, each worked out once per run."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        # (op, dtype) -> (its outputs are fp8, the names of its samples holding fp8 inputs)
        self._seen: dict[tuple[str, str], tuple[bool, frozenset[str]]] = {}

    def touches(self, case: Case) -> bool:
        op = irapi.get_op(case.op) if case.op is not None else None
        if op is None:
            return False
        dtypes = [case.dtype] if case.dtype is not None else irapi.op_dtypes(op)
        for dtype in dtypes:
            makes, holding = self._of(op, dtype)
            if makes or (holding if case.sample is None else case.sample in holding):
                return True
        return False

    def _of(self, op: Any, dtype: str) -> tuple[bool, frozenset[str]]:
        key = (op.name, dtype)
        if key not in self._seen:
            try:
                samples = self._ctx.cache.samples(op, dtype, self._ctx.quick)
            except Exception:
                samples = []  # a broken generator is the checks' error to report, not ours
            holding = frozenset(s.name for s in samples if _holds_fp8((s.args, dict(s.kwargs))))
            self._seen[key] = (bool(samples) and _makes_fp8(op, samples[0]), holding)
        return self._seen[key]


def _holds_fp8(obj: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and is_fp8(t.dtype) for _, t in iter_tensors(obj))


def _makes_fp8(op: Any, sample: Any) -> bool:
    """Whether the native function returns an fp8 tensor on ``sample``: run on meta copies
    (shapes and dtypes only), else on a CPU copy (the sample is shared with the checks);
    ``False`` when neither runs."""
    for device in ("meta", "cpu"):
        try:
            copy = sample.to(device) if device == "meta" else sample.clone()
            with torch.no_grad():
                return _holds_fp8(op.native(*copy.args, **copy.kwargs))
        except Exception:  # meta cannot run a function that reads values: the CPU can
            continue
    return False
