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

``compile.quant_fusion[mode]``: each FP8 quantization fusion (norm or activation, then a
quantization) fires once in a graph written with the unfused ops, in bfloat16, and the
fused ops, on the providers lowering picks here, give the unfused graph's outputs (on the
native functions) within each fused op's budget against its chain
(``opcore.ir.tolerances.fp8_chain_tolerance``: its fp8 tolerance for the ops defined as
their chain; for ``silu_and_mul_fp8_quant``, which rounds once, that plus the chain's
rounding of the intermediate to bfloat16). The details name the budgets.

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
import linecache
import logging
import re
import traceback
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
QUANT_FUSION = "compile.quant_fusion"
CHECKS = (MATCHES_EAGER, LOWERING, DYNAMIC_BATCH, FUSION, QUANT_FUSION)

QUICK_SAMPLES = 2  # per op x provider x dtype, as opcheck: every compile costs
DECODER_DTYPE = "float32"  # the small decoder of opcore.compile.decoder computes in float32
QUANT_DTYPE = "bfloat16"  # the quantization fusions' inputs: as FP8 models run them


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
    reason = _unavailable() or (
        None if irapi.available() else f"opcore.ir is not importable: {irapi.unavailable_reason()}"
    )
    if reason:
        return [Case(case_id(c), c, preset=S.NOT_APPLICABLE, preset_reason=reason) for c in wanted]
    out: list[Case] = []
    for mode, pick in _plans(ctx):
        if MATCHES_EAGER in wanted:
            for case in grid(
                ctx, MATCHES_EAGER, functools.partial(_matches_eager_body, mode), sample_filter=pick
            ):
                case.id = case_id(
                    MATCHES_EAGER, case.op, case.provider, case.dtype, case.sample, mode
                )
                case.info["mode"] = mode
                out.append(case)
        if LOWERING in wanted:
            out += _lowering_cases(ctx, mode, pick)
        for check, body in ((DYNAMIC_BATCH, _dynamic_batch_body), (FUSION, _fusion_body)):
            if check in wanted and ctx.wants(dtype=DECODER_DTYPE):
                out.append(_decoder_case(ctx, check, mode, body))
        if QUANT_FUSION in wanted and ctx.wants(dtype=QUANT_DTYPE):
            out.append(_quant_case(ctx, mode))
    return out


def _quant_case(ctx, mode: str) -> Case:
    case = Case(
        case_id(QUANT_FUSION, mode),
        QUANT_FUSION,
        dtype=QUANT_DTYPE,
        body=_quant_fusion_body(mode),
        info={"mode": mode},
    )
    if QUANT_DTYPE not in _claimed(ctx):
        case.preset = S.UNSUPPORTED
        case.preset_reason = f"platform {ctx.platform.name!r} does not claim {QUANT_DTYPE}"
    return case


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
                case = Case(
                    case_id(LOWERING, op_name, dtype, sample, mode),
                    LOWERING,
                    op=op_name,
                    dtype=dtype,
                    sample=sample,
                    layout=ctx.cache.layout(op, dtype, ctx.quick, sample),
                    body=_lowering_body(mode, op_name, dtype, sample),
                    info={"mode": mode},
                )
                if dtype not in claimed:
                    case.preset = S.UNSUPPORTED
                    case.preset_reason = (
                        f"platform {ctx.platform.name!r} does not claim {dtype} (supported_dtypes)"
                    )
                yield case


def _decoder_case(ctx, check: str, mode: str, body: Callable) -> Case:
    case = Case(
        case_id(check, mode), check, dtype=DECODER_DTYPE, body=body(mode), info={"mode": mode}
    )
    if DECODER_DTYPE not in _claimed(ctx):
        case.preset = S.UNSUPPORTED
        case.preset_reason = (
            f"platform {ctx.platform.name!r} does not claim {DECODER_DTYPE}, the decoder's dtype"
        )
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
    # torch logs a guard that cannot be built (30 lines of stack) before raising; the case's
    # details carry the traceback, so the terminal is spared.
    guards_logger = logging.getLogger("torch._guards")
    level = guards_logger.level
    guards_logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        guards_logger.setLevel(level)
        torch._dynamo.reset()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = (
            getattr(current, "inner_exception", None) or current.__cause__ or current.__context__
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


TRACE_RULE = "providers are traced by torch.compile: no Python control flow on sizes"
_TRACEBACK_LINES = 60  # the end of the traceback: where the failure is, not torch's preamble


def _traceback(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    lines = text.splitlines()
    return "\n".join(lines[-_TRACEBACK_LINES:])


def _source_file(fn: Callable) -> str | None:
    try:
        return inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:
        return None


def _failing_node(exc: BaseException, impl: Any) -> str | None:
    """Where in the provider's source the failure is: a frame of its file in the
    exception chain, or a ``File "...", line N`` of it in the message (Dynamo prints the
    user code it was tracing there). None when neither names it."""
    path = _source_file(impl.impl_fn) if impl is not None else None
    if not path:
        return None
    for e in _chain(exc):
        for frame in reversed(traceback.extract_tb(e.__traceback__)):
            if frame.filename == path:
                return f"{path}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
        m = re.search(rf'File "{re.escape(path)}", line (\d+)(?:, in (\w+))?(?:\n\s+(.+))?', str(e))
        if m:
            code = f": {m.group(3).strip()}" if m.group(3) else ""
            return f"{path}:{m.group(1)}{f' in {m.group(2)}' if m.group(2) else ''}{code}"
    return None


def _run(
    what: str,
    fn: Callable[..., dict[str, Any]],
    *args: Any,
    culprit: Callable[[], Any] | None = None,
    impl: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Call a check of `opcore.compile.testing`; its exceptions become statuses. A failure
    while compiling carries its traceback and, where known, the op, provider and source
    line that failed: ``impl`` is the one provider the check compiles; ``culprit`` (for a
    whole model) finds it by lowering op by op."""
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
            raise NotApplicable(
                f"{what}: the provider cannot be lowered here: {_first_line(lowering)}"
            ) from None
        root = chain[-1]
        cause = f" (caused by {_first_line(root)})" if root is not exc else ""
        details: dict[str, Any] = {"traceback": _traceback(exc)}
        found = None
        if impl is not None:
            found = {
                "op": impl.op_name,
                "provider": impl.provider,
                "node": _failing_node(exc, impl),
            }
        elif culprit is not None:
            found = culprit()
        where = ""
        if found:
            details["culprit"] = found
            node = f" at {found['node']}" if found.get("node") else ""
            alone = f" (lowered alone: {found['error']})" if found.get("error") else ""
            where = (
                f"; op {found['op']!r}, provider {found['provider']!r} fails to lower{node}{alone}"
                f" ({TRACE_RULE})"
            )
        raise CheckFailed(f"{what} raised {_first_line(exc)}{cause}{where}", details) from None


def _token_marked(sample: Any) -> tuple[tuple, dict]:
    """A copy of ``sample``'s arguments with the token dim (dim 0 of the first tensor, and of
    every tensor of that length in dim 0 with 2 or more dims) marked dynamic, as the
    decoder checks mark theirs."""
    copy = sample.clone()
    args, kwargs = copy.args, dict(copy.kwargs)
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    tokens = tensors[0].shape[0] if tensors and tensors[0].dim() else None
    for i, t in enumerate(tensors):
        if t.dim() and t.shape[0] == tokens and (i == 0 or t.dim() >= 2):
            torch._dynamo.mark_dynamic(t, 0)
    return args, kwargs


def _lower_op_by_op(ctx, mode: str) -> dict[str, Any] | None:
    """Compile each op alone, with the provider eager dispatch picks under the current
    config and its token dim dynamic (as the decoder runs it): the first that raises is the
    culprit, with its failing source line. None when each lowers alone."""
    import opcore.compile as oc

    for op_name in irapi.op_names():
        op = irapi.get_op(op_name)
        if op is None:
            continue
        sample = None
        for name in ctx.cache.names(op, DECODER_DTYPE, True):
            candidate = ctx.cache.get(op, DECODER_DTYPE, True, name)
            first = next((a for a in candidate.args if isinstance(a, torch.Tensor)), None)
            if first is not None and first.dim() and first.shape[0] >= 2:  # 0/1 are specialized
                sample = candidate.to(ctx.device)
                break
        if sample is None:
            continue
        provider = None
        guards: list[str] = []
        try:
            provider = op.dispatch(*sample.args, **sample.kwargs).provider
            args, kwargs = _token_marked(sample)
            compiled = torch.compile(
                lambda *a, **k: op(*a, **k),  # noqa: B023 (called at once)
                backend=oc.backend(mode=mode, fusion=False),
                fullgraph=True,
            )
            with torch.no_grad(), _guards_added(guards):
                compiled(*args, **kwargs)
        except Exception as exc:
            impl = op.impls.get(provider) if provider is not None else None
            node = _failing_node(exc, impl) or _guard_node(guards, impl)
            return {"op": op_name, "provider": provider, "node": node, "error": _first_line(exc)}
        finally:
            torch._dynamo.reset()
    return None


_SHAPES_LOGGER = "torch.fx.experimental.symbolic_shapes"


@contextlib.contextmanager
def _guards_added(into: list[str]) -> Iterator[None]:
    """Collect the shape guards torch adds while tracing (its debug log): a guard that
    pins a dynamic size names the source line that asked for it, which the exception
    (``ConstraintViolationError``) does not."""

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "[guard added]" in message:
                into.append(message)

    logger = logging.getLogger(_SHAPES_LOGGER)
    handler, level, propagate = _Collect(logging.DEBUG), logger.level, logger.propagate
    # Lowering the level turns on torch's related dynamic-shape logs elsewhere too: its
    # own handlers (on the "torch" logger) are muted meanwhile, so nothing is printed.
    muted = [
        (h, h.level)
        for name, lg in list(logging.root.manager.loggerDict.items())
        if name.split(".")[0] == "torch" and isinstance(lg, logging.Logger)
        for h in lg.handlers
    ]
    for h, _ in muted:
        h.setLevel(logging.CRITICAL)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # collected, not printed
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        for h, h_level in muted:
            h.setLevel(h_level)


def _guard_node(guards: list[str], impl: Any) -> str | None:
    """The provider's source line behind a guard of `_guards_added` (torch shortens the
    path in the message: matched by its end), with the guard."""
    path = _source_file(impl.impl_fn) if impl is not None else None
    if not path:
        return None
    for message in guards:
        m = re.search(r"\(([^()\s]+):(\d+) in (\w+)\)", message)
        if m and path.endswith(m.group(1)):
            line = linecache.getline(path, int(m.group(2))).strip()
            guard = message.split(" [guard added]")[0].removeprefix("eval ").strip()
            return f"{path}:{m.group(2)} in {m.group(3)}: {line} (guard {guard})"
    return None


def _device_sample(ctx, op_name: str, dtype: str, sample_name: str) -> tuple[Any, Any]:
    op = irapi.get_op(op_name)
    return op, ctx.cache.get(op, dtype, ctx.quick, sample_name).to(ctx.device)


def _matches_eager_body(mode: str, op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        op, sample = _device_sample(ctx, op_name, dtype, sample_name)
        with _compiling(ctx, mode):
            m = _run(
                f"compiling {op_name} with provider {provider!r} ({mode})",
                _testing().compiled_matches_eager,
                op,
                provider,
                sample,
                mode=mode,
                impl=op.impls.get(provider),
            )
        atol, rtol = irapi.tolerance(op, dtype)  # the bound compiled_matches_eager used
        return {
            "max_abs": m.get("max_abs_err"),
            "atol": atol,
            "rtol": rtol,
            "mode": mode,
            "how": m.get("how"),
        }

    return body


def _lowering_body(mode: str, op_name: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        op, sample = _device_sample(ctx, op_name, dtype, sample_name)
        with _compiling(ctx, mode):
            picked = op.dispatch(
                *sample.args, **sample.kwargs
            ).provider  # what lowering should pick
            m = _run(
                f"compiling {op_name} ({mode})",
                _testing().lowering_matches_dispatch,
                op,
                sample,
                mode=mode,
                impl=op.impls.get(picked),
            )
        return {"mode": mode, "chosen": m.get("provider")}

    return body


def _device_kwargs(ctx, fn: Callable) -> dict[str, Any]:
    """``device=`` for a decoder check that takes one; on another device than the CPU a
    check that builds its decoder on the CPU only cannot say anything about this platform."""
    if "device" in inspect.signature(fn).parameters:
        return {"device": ctx.device}
    if ctx.device.type != "cpu":
        raise NotApplicable(
            f"opcore.compile.testing.{fn.__name__} builds the decoder on the CPU "
            f"only (it takes no device), so it cannot check {ctx.device.type}"
        )
    return {}


def _dynamic_batch_body(mode: str):
    def body(ctx, _tol) -> dict[str, Any]:
        fn = _testing().no_recompile_on_dynamic_batch
        with _compiling(ctx, mode):
            m = _run(
                f"the small decoder with a dynamic batch ({mode})",
                fn,
                mode=mode,
                culprit=lambda: _lower_op_by_op(ctx, mode),
                **_device_kwargs(ctx, fn),
            )
        return {"max_abs": m.get("max_abs_err"), "mode": mode, "graphs": m.get("graphs")}

    return body


def _require_fp8_tensors(ctx) -> None:
    """``NotApplicable`` where the device cannot hold the fp8 tensors the quantized ops
    produce (a device without fp8 storage, such as the virtual device): no fusion of them
    can run there, whatever the compiler does."""
    from opcore.ir.quant import fp8_dtype

    dtype = fp8_dtype()
    try:
        torch.empty(1, dtype=dtype, device=ctx.device)
    except (RuntimeError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise NotApplicable(
            f"device {ctx.device} cannot hold {dtype} tensors ({type(exc).__name__}: {first}): "
            "the FP8 quantization fusions cannot run here"
        ) from None


def _quant_fusion_body(mode: str):
    def body(ctx, _tol) -> dict[str, Any]:
        fn = getattr(_testing(), "quant_fusions_fire", None)
        if fn is None:
            raise NotApplicable("this opcore has no quantization fusions to check")
        _require_fp8_tensors(ctx)
        with _compiling(ctx, mode):
            m = _run(
                f"the FP8 quantization fusions ({mode})",
                fn,
                mode=mode,
                dtype=torch.bfloat16,
                culprit=lambda: _lower_op_by_op(ctx, mode),
                **_device_kwargs(ctx, fn),
            )
        return {
            "mode": mode,
            "fusions": m.get("fusions"),
            "providers": m.get("providers"),
            "fp8_budgets": m.get("fp8_budgets"),
        }

    return body


def _fusion_body(mode: str):
    def body(ctx, _tol) -> dict[str, Any]:
        fn = _testing().fusion_fires_on_small_decoder
        with _compiling(ctx, mode):
            m = _run(
                f"the small decoder with fusion ({mode})",
                fn,
                mode=mode,
                culprit=lambda: _lower_op_by_op(ctx, mode),
                **_device_kwargs(ctx, fn),
            )
        return {"max_abs": m.get("max_abs_err"), "mode": mode, "fusions": m.get("fusions")}

    return body
