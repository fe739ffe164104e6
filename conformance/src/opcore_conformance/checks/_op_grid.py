"""The op x provider x dtype x sample grid shared by the per-op checks, and the helpers
that run one provider on one sample through the op's default overload."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from opcore_conformance import irapi
from opcore_conformance import status as S
from opcore_conformance.case import Case, CheckFailed, Tolerance, Unsupported, case_id
from opcore_conformance.tensors import to_device


def grid(
    ctx: Any,
    check: str,
    make_body: Callable[[str, str, str, str], Any] | None,
    *,
    providers: Callable[[Any], list[str]] | None = None,
    sample_filter: Callable[[list[str]], list[str]] | None = None,
    with_tolerance: bool = False,
) -> Iterator[Case]:
    """One case per op x provider x dtype x sample. Providers not supported here and
    dtypes the platform does not claim become ``unsupported`` cases (still listed, so the
    report shows the whole grid and expectation entries can name them)."""
    if not irapi.available():
        yield Case(
            case_id(check),
            check,
            preset=S.NOT_APPLICABLE,
            preset_reason=f"opcore.ir is not importable: {irapi.unavailable_reason()}",
        )
        return
    if make_body is None:  # only callers without ops pass None (fake.collect)
        raise TypeError(f"grid({check!r}): make_body is required when opcore.ir is importable")
    claimed = {str(d).removeprefix("torch.") for d in getattr(ctx.platform, "supported_dtypes", ())}
    for op_name in irapi.op_names():
        if not ctx.wants(op=op_name):
            continue
        op = irapi.get_op(op_name)
        impls = irapi.impls(op)
        names = providers(op) if providers is not None else list(impls)
        for provider in names:
            if not ctx.wants(provider=provider):
                continue
            impl = impls[provider]
            for dtype in irapi.op_dtypes(op):
                if not ctx.wants(dtype=dtype):
                    continue
                samples = ctx.cache.names(op, dtype, ctx.quick)
                if sample_filter is not None:
                    samples = sample_filter(samples)
                for sample in samples:
                    case = Case(
                        case_id(check, op_name, provider, dtype, sample),
                        check,
                        op=op_name,
                        provider=provider,
                        dtype=dtype,
                        sample=sample,
                        layout=ctx.cache.layout(op, dtype, ctx.quick, sample),
                        body=make_body(op_name, provider, dtype, sample),
                    )
                    if with_tolerance:
                        case.default_tolerance = Tolerance(*irapi.tolerance(op, dtype))
                    if not irapi.impl_supported(impl):
                        case.preset = S.UNSUPPORTED
                        case.preset_reason = (
                            f"provider {provider!r} of {op_name} is not supported here"
                        )
                    elif dtype not in claimed:
                        case.preset = S.UNSUPPORTED
                        case.preset_reason = (
                            f"platform {ctx.platform.name!r} does not claim {dtype} "
                            f"(supported_dtypes)"
                        )
                    yield case


def device_sample(
    ctx: Any, op_name: str, dtype: str, sample_name: str
) -> tuple[Any, Any, tuple, dict]:
    """(op, the CPU sample, device args, device kwargs): a fresh device copy each call."""
    op = irapi.get_op(op_name)
    sample = ctx.cache.get(op, dtype, ctx.quick, sample_name)
    args, kwargs = to_device((sample.args, dict(sample.kwargs)), ctx.device)
    return op, sample, args, kwargs


@contextlib.contextmanager
def forced(op: Any, provider: str, args: tuple, kwargs: dict) -> Iterator[None]:
    """Within the block ``op(*args, **kwargs)`` runs ``provider``; `Unsupported` when its
    ``supports_args`` declines these arguments (the op would run another provider)."""
    # "native" second: a provider with supports_args is then not the whole list (no
    # fallback warning), and a declined sample shows up as a different provider chosen.
    with op.set_priority([provider] if provider == "native" else [provider, "native"]):
        try:
            chosen = op.dispatch(*args, **kwargs).provider
        except Exception as exc:
            raise CheckFailed(
                f"{op.name}.dispatch with provider {provider!r} first raised "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if chosen != provider:
            raise Unsupported(
                f"supports_args of provider {provider!r} declines this sample "
                f"({op.name} would run {chosen!r})"
            )
        yield


def call(what: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call the code under test; its exceptions are failures of that code."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        raise CheckFailed(
            f"{what} raised {type(exc).__name__}: {text[0] if text else ''}"
        ) from None
