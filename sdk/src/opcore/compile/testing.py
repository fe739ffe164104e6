"""Compile checks a backend can run against its providers (the conformance suite calls them
as ``compile.*``; the SDK's tests call them too).

Each function compiles something real with `opcore.compile`, returns a dict of metrics on
success and raises `CompileCheckFailed` (an ``AssertionError``) with a readable message
otherwise. `ProviderNotApplicable` means the provider does not take the sample here
(``supported=False`` or ``supports_args`` rejects it), which a suite reports as
unsupported rather than failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from opcore.ir import IrOp
from opcore.ir import ops as _ops
from opcore.ir.samples import SampleInput


class CompileCheckFailed(AssertionError):
    """A compile check found a difference; the message says what."""


class ProviderNotApplicable(Exception):
    """The provider is not supported here or does not accept the sample."""


def _op(op: IrOp | str) -> IrOp:
    return getattr(_ops, op) if isinstance(op, str) else op


def _tensors(value: Any) -> list[torch.Tensor | None]:
    if isinstance(value, torch.Tensor) or value is None:
        return [value]
    return [v for item in value for v in _tensors(item)]


def _compare(
    what: str,
    got: Any,
    want: Any,
    atol: float,
    rtol: float,
    fp8: tuple[int, float] = (0, 0.0),
) -> float:
    """The largest difference between ``got`` and ``want``; raises when an output is off by
    more than ``atol + rtol * |want|``, or an fp8 output (one byte, floating) by more than
    ``fp8[0]`` codes or on more than the fraction ``fp8[1]`` of its elements. NaN must sit
    where ``want`` has NaN (and counts as no difference there); infinities must match."""
    worst = 0.0
    g, w = _tensors(got), _tensors(want)
    if len(g) != len(w):
        raise CompileCheckFailed(f"{what}: {len(g)} outputs, expected {len(w)}")
    for i, (a, b) in enumerate(zip(g, w, strict=True)):
        if a is None or b is None:
            if a is not b:
                raise CompileCheckFailed(f"{what}: output {i} is {a!r}, expected {b!r}")
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            raise CompileCheckFailed(
                f"{what}: output {i} is {tuple(a.shape)} {a.dtype}, expected "
                f"{tuple(b.shape)} {b.dtype}"
            )
        if a.is_floating_point() and a.element_size() == 1:
            steps = _fp8_steps(a, b)
            peak = int(steps.max()) if steps.numel() else 0
            off = int((steps > 0).sum())
            worst = max(worst, float(peak))
            if peak > fp8[0] or off > fp8[1] * steps.numel():
                raise CompileCheckFailed(
                    f"{what}: fp8 output {i} is up to {peak} codes off on {off} of "
                    f"{steps.numel()} elements (tolerance {fp8[0]} code(s) on {fp8[1]:.2%})"
                )
            continue
        # Compared in float64 on the CPU: a device need not compute (or hold) float64.
        a, b = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
        if not torch.equal(torch.isnan(a), torch.isnan(b)):
            raise CompileCheckFailed(f"{what}: output {i} has NaN where the other has not")
        diff = torch.where(a == b, 0.0, (a - b).abs()).nan_to_num(nan=0.0)
        err = float(diff.max()) if diff.numel() else 0.0
        worst = max(worst, err)
        if not torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True):
            raise CompileCheckFailed(
                f"{what}: output {i} differs by up to {err:.3g} (atol {atol}, rtol {rtol})"
            )
    return worst


@contextlib.contextmanager
def _forced(op: IrOp, provider: str, sample: SampleInput) -> Iterator[None]:
    impl = op.impls.get(provider)
    if impl is None:
        raise ProviderNotApplicable(f"op {op.name!r} has no provider {provider!r}")
    if not impl.supported:
        raise ProviderNotApplicable(f"provider {provider!r} of {op.name!r} is not supported here")
    with op.set_priority([provider, "native"] if provider != "native" else ["native"]):
        chosen = op.dispatch(*sample.args, **sample.kwargs).provider
        if chosen != provider:
            raise ProviderNotApplicable(
                f"provider {provider!r} does not accept sample {sample.name!r} of {op.name!r}"
            )
        yield


def _clone_args(sample: SampleInput) -> tuple[tuple, dict]:
    # SampleInput.clone keeps layouts: strided views (q/k/v slices of one buffer) stay
    # views, so a provider whose choice depends on strides is judged on the real layout.
    copy = sample.clone()
    return copy.args, dict(copy.kwargs)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point() or a.is_complex():
        return torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True)
    return torch.equal(a, b)


def _named_pairs(args: tuple, kwargs: dict, args0: tuple, kwargs0: dict):
    for i, (a, b) in enumerate(zip(args, args0, strict=True)):
        yield f"#{i}", a, b
    for k, v in kwargs.items():
        yield repr(k), v, kwargs0[k]


def compiled_matches_eager(
    op: IrOp | str, provider: str, sample: SampleInput, *, mode: str = "eager"
) -> dict[str, Any]:
    """Compile a function calling ``op`` with ``provider`` first in its priority; its
    output on ``sample`` equals the eager call's (the op's tolerance), and the lowering
    record shows ``provider``."""
    import opcore.compile as oc

    op = _op(op)
    with _forced(op, provider, sample), torch.no_grad():
        args, kwargs = _clone_args(sample)
        want = op(*args, **kwargs)
        be = oc.backend(mode=mode, fusion=False)
        compiled = torch.compile(lambda *a, **k: op(*a, **k), backend=be, fullgraph=True)
        args, kwargs = _clone_args(sample)
        before = _clone_args(SampleInput(sample.name, args, kwargs))
        got = compiled(*args, **kwargs)
        torch._dynamo.reset()
    # The default overload never writes its arguments, compiled or not (an in-place
    # provider lowered as a raw mutation once wrote the caller's tensors under Inductor).
    for name, now, then in _named_pairs(args, kwargs, *before):
        if isinstance(now, torch.Tensor) and not _same(now, then):
            raise CompileCheckFailed(
                f"{op.name}[{provider}] sample {sample.name!r} compiled ({mode}): argument "
                f"{name} was written"
            )
    record = be.last_record
    lowered = record.by_op().get(op.name, []) if record else []
    if record is None or lowered != [provider]:
        raise CompileCheckFailed(
            f"{op.name}: compiled graph lowered to {lowered}, expected [{provider!r}]"
        )
    # The tolerances are the input dtype's (an fp8 output has none of its own): the first
    # floating argument, which is the first output's dtype for the ops that keep it.
    dtype = next(
        (
            t.dtype
            for t in (*sample.args, *sample.kwargs.values())
            if isinstance(t, torch.Tensor) and t.is_floating_point()
        ),
        torch.float32,
    )
    atol, rtol = op.tolerance(dtype)
    from opcore.ir.tolerances import fp8_tolerance

    err = _compare(
        f"{op.name}[{provider}] sample {sample.name!r} compiled ({mode}) vs eager",
        got,
        want,
        atol,
        rtol,
        fp8_tolerance(op.name, dtype),
    )
    return {"max_abs_err": err, "how": record.lowered[0].how}


def lowering_matches_dispatch(
    op: IrOp | str, sample: SampleInput, *, mode: str = "eager", config: Any = None
) -> dict[str, Any]:
    """Under ``config`` (default: the current one, with ``mode``), lowering chooses for
    ``sample`` the provider eager dispatch chooses."""
    import copy

    import opcore.compile as oc
    from opcore.settings import get_current_config, set_current_config

    op = _op(op)
    cfg = copy.deepcopy(config if config is not None else get_current_config())
    cfg.compilation.mode = mode
    with set_current_config(cfg):
        expected = op.dispatch(*sample.args, **sample.kwargs).provider
    be = oc.backend(cfg, fusion=False)
    with torch.no_grad():
        compiled = torch.compile(lambda *a, **k: op(*a, **k), backend=be, fullgraph=True)
        args, kwargs = _clone_args(sample)
        compiled(*args, **kwargs)
        torch._dynamo.reset()
    if be.last_record is None:
        raise CompileCheckFailed(f"{op.name}: the backend recorded no compiled graph")
    lowered = be.last_record.by_op().get(op.name, [])
    if lowered != [expected]:
        raise CompileCheckFailed(
            f"{op.name} sample {sample.name!r}: lowering chose {lowered}, eager dispatch "
            f"chooses {expected!r} (mode {mode}, priority {op.effective_priority(cfg)})"
        )
    return {"provider": expected}


def _decoder_inputs(shape, tokens: int, generator: torch.Generator, device="cpu"):
    # Drawn on the CPU (one seed, the same numbers on every device), then moved.
    positions = torch.randint(0, shape.max_position, (tokens,), generator=generator)
    hidden = torch.randn(tokens, shape.hidden, generator=generator)
    return positions.to(device), hidden.to(device)


def no_recompile_on_dynamic_batch(
    batches: tuple[int, ...] = (3, 5, 11),
    *,
    mode: str = "eager",
    model: Any = None,
    device="cpu",
    config: Any = None,
) -> dict[str, Any]:
    """Compile the small decoder (or ``model(positions, hidden)``) on ``device`` with the
    token dim marked dynamic; running it at each of ``batches`` compiles one graph, and every
    output matches the uncompiled model. ``config`` (an `OpcoreConfig`) is the backend's;
    the current one when omitted."""
    import opcore.compile as oc
    from opcore.compile.decoder import Decoder

    model = (model if model is not None else Decoder()).to(device)
    shape = model.shape
    g = torch.Generator().manual_seed(0)
    be = oc.backend(config, mode=mode)
    compiled = torch.compile(model, backend=be)
    worst = 0.0
    with torch.no_grad():
        for t in batches:
            positions, hidden = _decoder_inputs(shape, t, g, device)
            torch._dynamo.mark_dynamic(positions, 0)
            torch._dynamo.mark_dynamic(hidden, 0)
            want = model(positions.clone(), hidden.clone())
            got = compiled(positions, hidden)  # the originals carry the dynamic marks
            worst = max(worst, _compare(f"decoder at {t} tokens", got, want, 1e-4, 1e-4))
        torch._dynamo.reset()
    if len(be.records) != 1:
        raise CompileCheckFailed(f"batches {batches} compiled {len(be.records)} graphs, expected 1")
    return {"graphs": len(be.records), "max_abs_err": worst}


def fusion_fires_on_small_decoder(
    *, mode: str = "eager", layers: int = 2, tokens: int = 7, device="cpu"
) -> dict[str, Any]:
    """Compile the small decoder on ``device`` with fusion: ``fuse_split_qkv_rmsnorm_rope``
    fires once per layer and ``fuse_add_rms_norm`` twice per layer (the first layer's input
    norm has no residual; the final norm adds one), no unfused
    ``rms_norm``/``rotary_embedding`` of the layers is left, and the output matches the
    uncompiled model."""
    import opcore.compile as oc
    from opcore.compile.decoder import Decoder, DecoderShape

    model = Decoder(DecoderShape(layers=layers)).to(device)
    g = torch.Generator().manual_seed(1)
    positions, hidden = _decoder_inputs(model.shape, tokens, g, device)
    be = oc.backend(mode=mode, fusion=True)
    with torch.no_grad():
        want = model(positions, hidden)
        got = torch.compile(model, backend=be)(positions, hidden)
        torch._dynamo.reset()
    record = be.last_record
    if record is None:
        raise CompileCheckFailed("the backend recorded no compiled graph")
    expected = {"fuse_split_qkv_rmsnorm_rope": layers, "fuse_add_rms_norm": 2 * layers}
    fired = {k: record.fusions.get(k, 0) for k in expected}
    if fired != expected:
        raise CompileCheckFailed(f"fusions fired {fired}, expected {expected}")
    counts = {op: len(p) for op, p in record.by_op().items()}
    if counts.get("rotary_embedding") or counts.get("rms_norm", 0) != 1:
        raise CompileCheckFailed(f"unfused ops left after fusion: {counts}")
    err = _compare("decoder compiled with fusion vs eager", got, want, 1e-4, 1e-4)
    return {"fusions": fired, "max_abs_err": err}


def _fp8_codes(q: torch.Tensor) -> torch.Tensor:
    """fp8 values as integers on a line: adjacent representable values differ by 1 (both
    e4m3 flavours are sign-magnitude bytes)."""
    bits = q.view(torch.uint8).to(torch.int32)
    mag = bits & 0x7F
    return torch.where(bits >= 0x80, -mag, mag)


def _fp8_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many fp8 values apart ``a`` and ``b`` are, elementwise (on the CPU): NaN with
    NaN (whatever its sign bit) is 0 apart, NaN with a number 2**20."""
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    steps = (_fp8_codes(a) - _fp8_codes(b)).abs()
    nan_a, nan_b = torch.isnan(a.float()), torch.isnan(b.float())
    steps = torch.where(nan_a & nan_b, 0, steps)
    return torch.where(nan_a != nan_b, 1 << 20, steps)


def _quant_patterns(x, res, w, scale, group_size: int):
    """Each quantization fusion's pattern once, written with the unfused ops."""
    eps = 1e-6
    q1 = _ops.scaled_fp8_quant(_ops.rms_norm(x, w, eps), scale)
    y2, r2 = _ops.fused_add_rms_norm(x, res, w, eps)
    q2 = _ops.scaled_fp8_quant(y2, scale)
    q3, s3 = _ops.dynamic_per_token_scaled_fp8_quant(_ops.rms_norm(res, w, eps))
    y4, r4 = _ops.fused_add_rms_norm(res, x, w, eps)
    q4, s4 = _ops.dynamic_per_token_scaled_fp8_quant(y4)
    gated = torch.cat([x, res], dim=-1)
    q5 = _ops.scaled_fp8_quant(_ops.silu_and_mul(gated), scale)
    q6, s6 = _ops.per_token_group_quant_fp8(_ops.silu_and_mul(gated * 0.5), group_size)
    return q1, q2, r2, q3, s3, q4, s4, r4, q5, q6, s6


# output index of _quant_patterns -> the fused op whose tolerance judges it
_QUANT_OUTPUT_OPS = (
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
    "rms_norm_dynamic_per_token_quant",
    "rms_norm_dynamic_per_token_quant",
    "rms_norm_dynamic_per_token_quant",
    "rms_norm_dynamic_per_token_quant",
    "rms_norm_dynamic_per_token_quant",
    "silu_and_mul_fp8_quant",
    "silu_and_mul_per_token_group_fp8_quant",
    "silu_and_mul_per_token_group_fp8_quant",
)


def quant_fusions_fire(
    *,
    mode: str = "eager",
    dtype: torch.dtype = torch.bfloat16,
    tokens: int = 7,
    hidden: int = 256,
    group_size: int = 128,
    device="cpu",
) -> dict[str, Any]:
    """Compile one function holding each FP8 quantization pattern (norm or activation,
    then a quantization, written with the unfused ops) on ``device`` with and without
    fusion: with fusion, under the current config, every pass of `QUANT_FUSION_PASSES`
    fires once and no unfused op is left; each output equals that of the unfused graph
    compiled with the ops' native functions within the budget between the fused op and
    that chain (`opcore.ir.tolerances.fp8_chain_tolerance`: the fused op's fp8 tolerance
    where it is defined as the chain, plus the chain's rounding of the intermediate to the
    input dtype for `silu_and_mul_fp8_quant`, which rounds once; residuals within its
    tolerance for their dtype, scales within one rounding of the input dtype). The fused
    ops run on the providers lowering picks, so this checks the platform's fused kernels
    inside a compiled graph. The metrics name each fp8 output's budget
    (``fp8_budgets``)."""
    import opcore.compile as oc
    from opcore.ir import all_ops
    from opcore.ir.tolerances import fp8_chain_tolerance

    missing = [n for n in set(_QUANT_OUTPUT_OPS) if n not in all_ops()]
    if missing:
        raise ProviderNotApplicable(f"ops {sorted(missing)} are not registered")
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(tokens, hidden, generator=g) * 2).to(device, dtype)
    res = torch.randn(tokens, hidden, generator=g).to(device, dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
    scale = torch.tensor(8.0 / 448.0, device=device)
    outs = {}
    records = {}
    unfused = {"rms_norm", "fused_add_rms_norm", "silu_and_mul", "scaled_fp8_quant"}
    unfused |= {"dynamic_per_token_scaled_fp8_quant", "per_token_group_quant_fp8"}
    for fusion in (False, True):
        be = oc.backend(mode=mode, fusion=fusion)
        fn = torch.compile(_quant_patterns, backend=be, fullgraph=True)
        with contextlib.ExitStack() as stack, torch.no_grad():
            if not fusion:  # the reference: the unfused graph on the defining functions
                for name in unfused:
                    stack.enter_context(all_ops()[name].set_priority(["native"]))
            outs[fusion] = fn(x, res, w, scale, group_size)
        torch._dynamo.reset()
        if be.last_record is None:
            raise CompileCheckFailed("the backend recorded no compiled graph")
        records[fusion] = be.last_record
    record = records[True]
    expected = dict.fromkeys(oc.QUANT_FUSION_PASSES, 1)
    fired = {k: record.fusions.get(k, 0) for k in expected}
    if fired != expected:
        raise CompileCheckFailed(
            f"quantization fusions fired {fired}, expected {expected}; "
            f"misses: {record.fusion_misses}"
        )
    left = sorted(set(record.by_op()) & unfused)
    if left:
        raise CompileCheckFailed(f"unfused ops left after the quantization fusions: {left}")
    worst: dict[str, Any] = {}
    budgets: dict[str, tuple[int, float]] = {}
    for i, (got, want) in enumerate(zip(outs[True], outs[False], strict=True)):
        what = f"output {i} ({_QUANT_OUTPUT_OPS[i]}, {mode}) fused vs unfused native"
        if got.dtype != want.dtype or got.shape != want.shape:
            raise CompileCheckFailed(
                f"{what}: {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}"
            )
        if got.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
            max_ulps, fraction = fp8_chain_tolerance(_QUANT_OUTPUT_OPS[i], dtype)
            budgets[_QUANT_OUTPUT_OPS[i]] = (max_ulps, fraction)
            steps = _fp8_steps(got, want)
            off = float((steps > 0).float().mean()) if steps.numel() else 0.0
            if steps.numel() and (int(steps.max()) > max_ulps or off > fraction):
                raise CompileCheckFailed(
                    f"{what}: up to {int(steps.max())} fp8 codes apart on {off:.2%} of elements "
                    f"(budget against the unfused chain {max_ulps} code(s) on {fraction:.2%})"
                )
            worst[f"output {i} codes off"] = off
        elif got.dtype == torch.float32 and dtype != torch.float32:
            # scales: the row maximum may be taken before or after the intermediate's
            # rounding to the input dtype (Inductor fuses the unfused chain and skips the
            # rounding), so one rounding of that dtype apart
            rtol = torch.finfo(dtype).eps
            worst[f"output {i} max_abs_err"] = _compare(what, got, want, 0.0, rtol)
        else:  # residual sums (and fp32 scales): the fused op's tolerance for their dtype
            atol, rtol = all_ops()[_QUANT_OUTPUT_OPS[i]].tolerance(got.dtype)
            worst[f"output {i} max_abs_err"] = _compare(what, got, want, atol, rtol)
    providers = {op: p for op, p in record.by_op().items()}
    return {"fusions": fired, "providers": providers, "fp8_budgets": budgets, **worst}


__all__ = [
    "CompileCheckFailed",
    "ProviderNotApplicable",
    "compiled_matches_eager",
    "fusion_fires_on_small_decoder",
    "lowering_matches_dispatch",
    "no_recompile_on_dynamic_batch",
    "quant_fusions_fire",
]
