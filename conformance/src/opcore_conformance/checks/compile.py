"""``compile.*``: the platform's providers through `opcore.compile` (``torch.compile`` with
opcore's passes). The bodies are `opcore.compile.testing`'s checks; this module turns them
into cases and their exceptions into statuses.

``compile.matches_eager[op-provider-dtype-sample-mode]``: a function calling the op, with
the provider first in its priority, compiled in ``mode``, gives the eager call's output
(the op's tolerance), and the lowering record shows that provider.

``compile.lowering[op-dtype-sample-mode]``: under the current config (the platform's
default priority for ``mode``, the user's ``OPCORE_IR_OP_PRIORITY``), lowering picks the
provider eager dispatch picks for the sample.

``compile.dynamic_batch[mode]``: the small decoder compiled with its token dim dynamic
runs at several batch sizes with one compiled graph, matching the uncompiled model.

``compile.fusion[mode]``: on the small decoder the fusion passes fire (once per layer for
the QKV fusion, twice per layer for add + RMSNorm) and leave its output unchanged.

Modes and cost: ``torch.compile`` is slow, Inductor most of all, so ``--quick`` compiles
with the ``eager`` backend mode (Dynamo, AOTAutograd, the opcore passes; the lowered FX
graph runs as Python, no code generation) on the first two samples per op, provider and
dtype. ``--full`` adds ``-eager`` cases for every sample and ``-inductor`` cases (Inductor's
code generation) for those first two samples and both decoder checks.

Statuses: a provider not supported here, or whose ``supports_args`` declines the sample,
is ``unsupported``; a provider that cannot be traced on fake tensors is lowered as an
opaque call (the same provider runs; ``how: opaque`` in the details) and is checked like
any other; one that cannot be lowered at all (``LoweringError``), a device Inductor has
no code generator for, or a decoder check that cannot run on this device is
``not_applicable`` with the reason. A compiled result that differs, a lowering that picks
another provider, a recompilation and a fusion that does not fire are ``fail``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from opcore_conformance import irapi
from opcore_conformance import status as S
from opcore_conformance.case import Case, CheckFailed, NotApplicable, Unsupported, case_id
from opcore_conformance.checks._op_grid import grid

MATCHES_EAGER = "compile.matches_eager"
LOWERING = "compile.lowering"
DYNAMIC_BATCH = "compile.dynamic_batch"
FUSION = "compile.fusion"
CHECKS = (MATCHES_EAGER, LOWERING, DYNAMIC_BATCH, FUSION)

QUICK_SAMPLES = 2  # per op x provider x dtype, as opcheck: every compile costs
DECODER_DTYPE = "float32"  # the small decoder of opcore.compile.decoder computes in float32


def _testing() -> Any:
    import opcore.compile.testing as testing

    return testing


def _unavailable() -> str | None:
    try:
        _testing()
    except ImportError as exc:
        return f"opcore.compile.testing is not importable: {type(exc).__name__}: {exc}"
    return None


def _plans(ctx) -> list[tuple[str, Callable[[list[str]], list[str]]]]:
    """(mode, which of the samples' names it runs) for this run."""
    first = lambda names: names[:QUICK_SAMPLES]  # noqa: E731
    if ctx.quick:
        return [("eager", first)]
    return [("eager", lambda names: names), ("inductor", first)]


def collect(ctx) -> list[Case]:
    wanted = [c for c in CHECKS if ctx.wants(check=c)]
    if not wanted:
        return []
    reason = _unavailable() or (None if irapi.available() else
                                f"opcore.ir is not importable: {irapi.unavailable_reason()}")
    if reason:
        return [Case(case_id(c), c, preset=S.NOT_APPLICABLE, preset_reason=reason) for c in wanted]
    out: list[Case] = []
    for mode, pick in _plans(ctx):
        if MATCHES_EAGER in wanted:
            for case in grid(ctx, MATCHES_EAGER, functools.partial(_matches_eager_body, mode),
                             sample_filter=pick):
                case.id = case_id(MATCHES_EAGER, case.op, case.provider, case.dtype, case.sample, mode)
                case.info["mode"] = mode
                out.append(case)
        if LOWERING in wanted:
            out += _lowering_cases(ctx, mode, pick)
        for check, body in ((DYNAMIC_BATCH, _dynamic_batch_body), (FUSION, _fusion_body)):
            if check in wanted and ctx.wants(dtype=DECODER_DTYPE):
                out.append(_decoder_case(ctx, check, mode, body))
    return out


def _claimed(ctx) -> set[str]:
    return {str(d).removeprefix("torch.") for d in getattr(ctx.platform, "supported_dtypes", ())}


def _lowering_cases(ctx, mode: str, pick: Callable[[list[str]], list[str]]) -> Iterator[Case]:
    claimed = _claimed(ctx)
    for op_name in irapi.op_names():
        if not ctx.wants(op=op_name):
            continue
        op = irapi.get_op(op_name)
        for dtype in irapi.op_dtypes(op):
            if not ctx.wants(dtype=dtype):
                continue
            for sample in pick(ctx.cache.names(op, dtype, ctx.quick)):
                case = Case(case_id(LOWERING, op_name, dtype, sample, mode), LOWERING,
                            op=op_name, dtype=dtype, sample=sample,
                            layout=ctx.cache.layout(op, dtype, ctx.quick, sample),
                            body=_lowering_body(mode, op_name, dtype, sample), info={"mode": mode})
                if dtype not in claimed:
                    case.preset = S.UNSUPPORTED
                    case.preset_reason = f"platform {ctx.platform.name!r} does not claim {dtype} (supported_dtypes)"
                yield case


def _decoder_case(ctx, check: str, mode: str, body: Callable) -> Case:
    case = Case(case_id(check, mode), check, dtype=DECODER_DTYPE, body=body(mode), info={"mode": mode})
    if DECODER_DTYPE not in _claimed(ctx):
        case.preset = S.UNSUPPORTED
        case.preset_reason = f"platform {ctx.platform.name!r} does not claim {DECODER_DTYPE}, the decoder's dtype"
    return case


# --------------------------------------------------------------------------- running
@functools.cache
def _inductor_reason(device_type: str) -> str | None:
    """Why Inductor cannot compile for ``device_type`` here (``None`` when it can)."""
    try:
        from torch._inductor.codegen.common import (
            get_scheduling_for_device,
            init_backend_registration,
        )

        init_backend_registration()
        if get_scheduling_for_device(device_type) is None:
            return f"Inductor has no code generator registered for device type {device_type!r}"
    except Exception as exc:
        return f"Inductor is not usable here: {type(exc).__name__}: {exc}"
    return None


@contextlib.contextmanager
def _compiling(ctx, mode: str) -> Iterator[None]:
    """The environment of one compile check: Inductor present for the device; Dynamo's
    caches dropped afterwards, also when the check failed half-way. (Threads are left
    alone: on a 2-core CPU, one intra-op thread and one compile thread for the Inductor
    cases made them no faster.)"""
    if mode == "inductor" and (reason := _inductor_reason(ctx.device.type)):
        raise NotApplicable(reason)
    try:
        yield
    finally:
        torch._dynamo.reset()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = getattr(current, "inner_exception", None) or current.__cause__ or current.__context__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _run(what: str, fn: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call a check of `opcore.compile.testing`; its exceptions become statuses."""
    testing = _testing()
    from opcore.compile import LoweringError

    try:
        return fn(*args, **kwargs)
    except testing.ProviderNotApplicable as exc:
        raise Unsupported(str(exc)) from None
    except testing.CompileCheckFailed as exc:
        raise CheckFailed(str(exc)) from None
    except Exception as exc:  # raised while compiling or running: the code under test
        chain = list(_chain(exc))
        lowering = next((e for e in chain if isinstance(e, LoweringError)), None)
        if lowering is not None:
            raise NotApplicable(f"{what}: the provider cannot be lowered here: {_first_line(lowering)}") from None
        root = chain[-1]
        cause = f" (caused by {_first_line(root)})" if root is not exc else ""
        raise CheckFailed(f"{what} raised {_first_line(exc)}{cause}") from None


def _device_sample(ctx, op_name: str, dtype: str, sample_name: str) -> tuple[Any, Any]:
    op = irapi.get_op(op_name)
    return op, ctx.cache.get(op, dtype, ctx.quick, sample_name).to(ctx.device)


def _matches_eager_body(mode: str, op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        op, sample = _device_sample(ctx, op_name, dtype, sample_name)
        with _compiling(ctx, mode):
            m = _run(f"compiling {op_name} with provider {provider!r} ({mode})",
                     _testing().compiled_matches_eager, op, provider, sample, mode=mode)
        atol, rtol = irapi.tolerance(op, dtype)  # the bound compiled_matches_eager used
        return {"max_abs": m.get("max_abs_err"), "atol": atol, "rtol": rtol, "mode": mode,
                "how": m.get("how")}

    return body


def _lowering_body(mode: str, op_name: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        op, sample = _device_sample(ctx, op_name, dtype, sample_name)
        with _compiling(ctx, mode):
            m = _run(f"compiling {op_name} ({mode})", _testing().lowering_matches_dispatch,
                     op, sample, mode=mode)
        return {"mode": mode, "chosen": m.get("provider")}

    return body


def _device_kwargs(ctx, fn: Callable) -> dict[str, Any]:
    """``device=`` for a decoder check that takes one; on another device than the CPU a
    check that builds its decoder on the CPU only cannot say anything about this platform."""
    if "device" in inspect.signature(fn).parameters:
        return {"device": ctx.device}
    if ctx.device.type != "cpu":
        raise NotApplicable(f"opcore.compile.testing.{fn.__name__} builds the decoder on the CPU "
                            f"only (it takes no device), so it cannot check {ctx.device.type}")
    return {}


def _dynamic_batch_body(mode: str):
    def body(ctx, _tol) -> dict[str, Any]:
        fn = _testing().no_recompile_on_dynamic_batch
        with _compiling(ctx, mode):
            m = _run(f"the small decoder with a dynamic batch ({mode})", fn, mode=mode, **_device_kwargs(ctx, fn))
        return {"max_abs": m.get("max_abs_err"), "mode": mode, "graphs": m.get("graphs")}

    return body


def _fusion_body(mode: str):
    def body(ctx, _tol) -> dict[str, Any]:
        fn = _testing().fusion_fires_on_small_decoder
        with _compiling(ctx, mode):
            m = _run(f"the small decoder with fusion ({mode})", fn, mode=mode, **_device_kwargs(ctx, fn))
        return {"max_abs": m.get("max_abs_err"), "mode": mode, "fusions": m.get("fusions")}

    return body
