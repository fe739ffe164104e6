"""The functional contract of an op's default overload, and its in-place variant.

``functional[op-provider-dtype-sample]``: the default overload mutates no input (bitwise,
strided inputs and the bytes around them included) and returns no output that shares
storage with an input.
``maybe_inplace[op-provider-dtype-sample]`` (ops declared ``allow_inplace``): the results
of ``maybe_inplace`` are bitwise equal to the default overload's.
"""

from __future__ import annotations

from typing import Any

from opcore_conformance import irapi
from opcore_conformance.case import CheckFailed
from opcore_conformance.checks._op_grid import call, device_sample, forced, grid
from opcore_conformance.tensors import bitwise_equal, clone_preserving, iter_tensors, to_device

CHECK = "functional"
INPLACE_CHECK = "maybe_inplace"


def collect(ctx) -> list:
    cases = list(grid(ctx, CHECK, _functional_body))
    if irapi.available():
        inplace_ops = {n for n in irapi.op_names() if irapi.get_op(n).allow_inplace}
        cases += [
            c
            for c in grid(ctx, INPLACE_CHECK, _inplace_body)
            if c.op in inplace_ops or c.op is None
        ]
    return cases


def _named_inputs(op: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    names = list(op.param_names)
    out = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args)]
    return out + list(kwargs.items())


def _functional_body(op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        op, _, args, kwargs = device_sample(ctx, op_name, dtype, sample_name)
        before = clone_preserving((args, kwargs))
        with forced(op, provider, args, kwargs):
            out = call(f"{op_name} with provider {provider!r}", op, *args, **kwargs)
        ctx.platform.synchronize()
        problems = []
        inputs = _named_inputs(op, args, kwargs)
        saved = _named_inputs(op, *before)
        storage = _has_storage(inputs)
        for (name, now), (_, was) in zip(inputs, saved, strict=False):
            if not hasattr(now, "untyped_storage"):
                continue
            if storage:
                # Compare the whole storage: a kernel that writes past a strided view's
                # elements (into a neighbouring q/k/v slice) mutates an input as well.
                now = now.new_empty(0).set_(now.untyped_storage())
                was = was.new_empty(0).set_(was.untyped_storage())
            if not bitwise_equal(now, was):
                problems.append(
                    f"input {name!r} was modified (the default overload must not "
                    f"mutate its inputs; use maybe_inplace for in-place kernels)"
                )
        for path, o in iter_tensors(out) if storage else ():
            if o is None or not hasattr(o, "untyped_storage"):
                continue
            for name, t in inputs:
                if (
                    hasattr(t, "untyped_storage")
                    and o.device == t.device
                    and o.numel()
                    and t.numel()
                    and o.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                ):
                    problems.append(f"output {path} shares storage with input {name!r}")
        if problems:
            raise CheckFailed(f"{op_name} with provider {provider!r}: " + "; ".join(problems))
        # Without storages (XLA's lazy tensors) only the input values can be compared and
        # aliasing cannot be observed: say so in the record rather than pass silently.
        return {} if storage else {"checked": "input values only (no storages on this device)"}

    return body


def _has_storage(inputs: list[tuple[str, Any]]) -> bool:
    """Whether this device's tensors expose storages (XLA tensors raise on access)."""
    for _, t in inputs:
        if hasattr(t, "untyped_storage"):
            try:
                t.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):
                return False
    return True


def _inplace_body(op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        op, sample, args, kwargs = device_sample(ctx, op_name, dtype, sample_name)
        args2, kwargs2 = to_device((sample.args, dict(sample.kwargs)), ctx.device)
        with forced(op, provider, args, kwargs):
            out = call(f"{op_name} with provider {provider!r}", op, *args, **kwargs)
            out2 = call(
                f"{op_name}.maybe_inplace with provider {provider!r}",
                op.maybe_inplace,
                *args2,
                **kwargs2,
            )
        ctx.platform.synchronize()
        a, b = list(iter_tensors(out)), list(iter_tensors(out2))
        if [p for p, _ in a] != [p for p, _ in b]:
            raise CheckFailed(
                f"maybe_inplace returns {[p for p, _ in b]}, the default overload "
                f"{[p for p, _ in a]}"
            )
        diffs = [
            p
            for (p, x), (_, y) in zip(a, b, strict=False)
            if (x is None) != (y is None)
            or (x is not None and y is not None and not bitwise_equal(x, y))
        ]
        if diffs:
            raise CheckFailed(
                f"{op_name}.maybe_inplace with provider {provider!r} differs from the "
                f"default overload in {', '.join(diffs)}"
            )
        return {}

    return body
