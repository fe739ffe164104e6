"""The suite's one view of `opcore.ir`: ops, providers, samples, tolerances.

Everything the checks need from the op registry goes through here, so the checks read as
statements about ops and providers, and a change in `opcore.ir` is absorbed in one place.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import torch

from opcore_conformance.options import DEFAULT_DTYPES, dtype_from_name


@functools.cache
def _ir() -> Any:
    import opcore.ir as ir

    return ir


def available() -> bool:
    try:
        _ir()
    except ImportError:
        return False
    return True


def unavailable_reason() -> str:
    try:
        _ir()
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def load_kernels(platform: Any) -> None:
    """Run the general plugins and the platform's kernel imports, as a first dispatch
    would, so every provider the platform brings is registered before collection."""
    from opcore.plugins import load_general_plugins

    load_general_plugins()
    if not available():
        return
    try:
        from opcore.ir import ensure_kernels_loaded
    except ImportError:  # an opcore from before it was exported there
        platform.import_kernels()
        platform.import_ir_kernels()
    else:
        ensure_kernels_loaded()


def all_ops() -> dict[str, Any]:
    from opcore.ir import all_ops as _all

    return _all()


def op_names() -> list[str]:
    return sorted(all_ops()) if available() else []


def get_op(name: str) -> Any:
    """The op named ``name`` (untyped: the suite runs against several opcore versions),
    or None for a name no op has."""
    return all_ops().get(name)


def impls(op: Any) -> dict[str, Any]:
    return dict(op.impls)


def impl_supported(impl: Any) -> bool:
    return bool(impl.supported)


def provider_properties(impl: Any) -> frozenset[str]:
    """The properties a provider declares (docs/properties.md); none for an opcore that
    predates them."""
    declared = getattr(impl, "properties", None)
    return frozenset(declared.names()) if declared is not None else frozenset()


def op_dtypes(op: Any) -> list[str]:
    """Dtypes an op is checked in (fp32, fp16, bf16 unless it says; docs/design.md#op-semantics)."""
    names = getattr(op, "dtypes", None)
    if names:
        return [str(d).removeprefix("torch.") for d in names]
    return list(DEFAULT_DTYPES)


def tolerance(op: Any, dtype: str) -> tuple[float, float]:
    atol, rtol = op.tolerance(dtype_from_name(dtype))
    return float(atol), float(rtol)


def fp8_tolerance(op: Any, dtype: str) -> tuple[int, float]:
    """``(max_codes, fraction)`` for the op's fp8 outputs on ``dtype`` inputs
    (`opcore.ir.tolerances.fp8_tolerance`; exact, ``(0, 0.0)``, for an op without one)."""
    try:
        from opcore.ir.tolerances import fp8_tolerance as declared
    except ImportError:  # an opcore without fp8 ops has no fp8 outputs either
        return 0, 0.0
    max_codes, fraction = declared(op.name, dtype_from_name(dtype))
    return int(max_codes), float(fraction)


def error_budget(op: Any, dtype: str) -> Any | None:
    """The op's own ``(factor, floor_ulps)`` for ``dtype``, or None when it declares none
    (an op without ``error_budget``, or one returning None for this dtype)."""
    declared = getattr(op, "error_budget", None)
    return declared(dtype_from_name(dtype)) if callable(declared) else None


class SampleCache:
    """Samples per (op, dtype, mode), generated on the CPU by the op's generator (fixed
    seed): all quick lists are kept, and the most recent full ones."""

    def __init__(self, size: int = 6) -> None:
        # Quick lists are small: keep them all (every check reuses them). Full lists can be
        # large: keep only ``size`` of them.
        self._size = size
        self._lru: collections.OrderedDict[tuple[str, str, bool], list[Any]] = (
            collections.OrderedDict()
        )
        self._names: dict[tuple[str, str, bool], list[str]] = {}
        self._layouts: dict[tuple[str, str, bool, str], str] = {}

    def samples(self, op: Any, dtype: str, quick: bool) -> list[Any]:
        key = (op.name, dtype, quick)
        if key in self._lru:
            self._lru.move_to_end(key)
            return self._lru[key]
        got = list(op.sample_inputs("cpu", dtype_from_name(dtype), quick=quick))
        names = [s.name for s in got]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"op {op.name!r}: sample names repeat for {dtype}: {dupes}")
        self._names[key] = names
        for sample in got:
            strided = any(not t.is_contiguous() for _, t in sample.tensors())
            # Named first: mypy reads d[(*k, n)] as 3.11-only d[*k, n] syntax.
            layout_key = (*key, sample.name)
            self._layouts[layout_key] = "strided" if strided else "contiguous"
        self._lru[key] = got
        full = [k for k in self._lru if not k[2]]
        while len(full) > self._size:
            del self._lru[full.pop(0)]
        return got

    def names(self, op: Any, dtype: str, quick: bool) -> list[str]:
        key = (op.name, dtype, quick)
        if key not in self._names:
            self.samples(op, dtype, quick)
        return self._names[key]

    def layout(self, op: Any, dtype: str, quick: bool, name: str) -> str:
        """``contiguous``, or ``strided`` when some tensor argument is not contiguous."""
        self.names(op, dtype, quick)
        return self._layouts[(op.name, dtype, quick, name)]

    def get(self, op: Any, dtype: str, quick: bool, name: str) -> Any:
        for s in self.samples(op, dtype, quick):
            if s.name == name:
                return s
        raise KeyError(f"op {op.name!r} has no {dtype} sample named {name!r}")


def provider_table() -> dict[str, dict[str, Any]]:
    """``{op: {provider: {"supported", "inplace", "identity"}}}`` for the report header."""
    if not available():
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, op in all_ops().items():
        out[name] = {}
        for provider, impl in op.impls.items():
            try:
                ident = impl.identity_hash()[:16]
            except Exception:
                ident = None
            out[name][provider] = {
                "supported": bool(impl.supported),
                "inplace": bool(impl.inplace),
                "supports_args": impl.supports_args is not None,
                "identity": ident,
            }
    return out


def sample_seed() -> int | None:
    try:
        from opcore.ir.samples import SEED
    except ImportError:
        return None
    return int(SEED)


def dtype_of(name: str) -> torch.dtype:
    return dtype_from_name(name)
