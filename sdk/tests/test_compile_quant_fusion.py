"""opcore.compile's FP8 quantization fusions (`opcore.compile.passes.fuse_quant`), with real
torch.compile and the opcore backend on the CPU (mode "eager": AOTAutograd and the opcore
passes without Inductor's code generation, to keep the suite fast; one case under Inductor).

Each pattern is written the way a user writes it (the unfused ops, the quantized output
read by ``torch._scaled_mm``); it is compiled with and without fusion, the record must name
the fused op, and the two compiled results must agree within the fused op's budget against
its chain (`opcore.ir.tolerances.fp8_chain_tolerance`). A fused op defined as its unfused
chain agrees with it bit for bit on ``native``; ``silu_and_mul_fp8_quant`` rounds once (its
fp32 product is quantized), so it differs from the chain by the chain's rounding of the
intermediate, within that budget."""

from __future__ import annotations

import pytest
import torch

import opcore.compile as oc
from opcore.ir import ops
from opcore.ir.tolerances import fp8_chain_tolerance, fp8_tolerance

FP8 = torch.float8_e4m3fn  # the CPU platform declares no fp8 dtype: the ops' default


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _ordinal(q: torch.Tensor) -> torch.Tensor:
    """e4m3 codes on a line: adjacent representable values differ by 1."""
    bits = q.view(torch.uint8).to(torch.int32)
    mag = bits & 0x7F
    return torch.where(bits >= 0x80, -mag, mag)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` as torch.equal can compare it bit for bit (fp8 as its bytes)."""
    return t.view(torch.uint8) if t.dtype == FP8 else t


def _assert_fp8_close(got, want, what: str, tolerance: tuple[int, float]) -> None:
    assert got.dtype == want.dtype == FP8 and got.shape == want.shape, what
    max_ulps, fraction = tolerance
    steps = (_ordinal(got) - _ordinal(want)).abs()
    off = float((steps > 0).float().mean()) if steps.numel() else 0.0
    assert int(steps.max()) <= max_ulps, f"{what}: {int(steps.max())} e4m3 steps apart"
    assert off <= fraction, f"{what}: {off:.1%} of elements off (tolerance {fraction:.1%})"


def _assert_close(got, want, what: str, tolerance: tuple[int, float]) -> None:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        name = f"{what} output {i}"
        if a.dtype == FP8:
            _assert_fp8_close(a, b, name, tolerance)
        elif a.dtype == torch.float32 and a.ndim == 2 and a.shape[-1] <= 2:
            # scales, one per token or per group of 32: the row maximum's rounding only
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-9, msg=name)
        else:
            ref = b.float().abs().max().clamp(min=1.0)
            err = float((a.float() - b.float()).abs().max() / ref)
            assert err <= 0.1, f"{name}: max diff {err:.3g} of the output's magnitude"


# --------------------------------------------------------------------------- patterns
T, H = 6, 64


def _mm(q, w_fp8, scale_a, w_scale):
    """A linear layer's FP8 GEMM: q [T, H] e4m3 x weight [N, H] e4m3 (read transposed)."""
    return torch._scaled_mm(q, w_fp8.t(), scale_a=scale_a, scale_b=w_scale, out_dtype=torch.float32)


def rms_static(x, res, w, scale, wq, ws, ws_row):
    q = ops.scaled_fp8_quant(ops.rms_norm(x, w, 1e-6), scale)
    return q, _mm(q, wq, scale, ws)


def add_rms_static(x, res, w, scale, wq, ws, ws_row):
    s = x + res
    q = ops.scaled_fp8_quant(ops.rms_norm(s, w, 1e-6), scale)
    return q, s, _mm(q, wq, scale, ws)


def fused_add_rms_static(x, res, w, scale, wq, ws, ws_row):
    y, s = ops.fused_add_rms_norm(x, res, w, 1e-6)
    q = ops.scaled_fp8_quant(y, scale)
    return q, s, _mm(q, wq, scale, ws)


def rms_dynamic(x, res, w, scale, wq, ws, ws_row):
    q, sc = ops.dynamic_per_token_scaled_fp8_quant(ops.rms_norm(x, w, 1e-6))
    return q, sc, _mm(q, wq, sc, ws_row)


def add_rms_dynamic(x, res, w, scale, wq, ws, ws_row):
    s = x + res
    q, sc = ops.dynamic_per_token_scaled_fp8_quant(ops.rms_norm(s, w, 1e-6))
    return q, sc, s, _mm(q, wq, sc, ws_row)


def silu_static(x, res, w, scale, wq, ws, ws_row):
    q = ops.scaled_fp8_quant(ops.silu_and_mul(torch.cat([x, res], -1)), scale)
    return q, _mm(q, wq, scale, ws)


def silu_group(x, res, w, scale, wq, ws, ws_row):
    return ops.per_token_group_quant_fp8(ops.silu_and_mul(torch.cat([x, res], -1)), 32)


PATTERNS = {
    rms_static: ({"fuse_rms_norm_static_fp8_quant": 1}, "rms_norm_static_fp8_quant"),
    add_rms_static: (
        {"fuse_add_rms_norm": 1, "fuse_add_rms_norm_static_fp8_quant": 1},
        "fused_add_rms_norm_static_fp8_quant",
    ),
    fused_add_rms_static: (
        {"fuse_add_rms_norm_static_fp8_quant": 1},
        "fused_add_rms_norm_static_fp8_quant",
    ),
    rms_dynamic: ({"fuse_rms_norm_dynamic_per_token_quant": 1}, "rms_norm_dynamic_per_token_quant"),
    add_rms_dynamic: (
        {"fuse_add_rms_norm": 1, "fuse_add_rms_norm_dynamic_per_token_quant": 1},
        "rms_norm_dynamic_per_token_quant",
    ),
    silu_static: ({"fuse_silu_and_mul_fp8_quant": 1}, "silu_and_mul_fp8_quant"),
    silu_group: (
        {"fuse_silu_and_mul_per_token_group_fp8_quant": 1},
        "silu_and_mul_per_token_group_fp8_quant",
    ),
}
# fused ops that quantize their intermediate from fp32 instead of from x's dtype
ROUNDS_ONCE = {"silu_and_mul_fp8_quant"}
UNFUSED = {
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "scaled_fp8_quant",
    "dynamic_per_token_scaled_fp8_quant",
    "per_token_group_quant_fp8",
}


def _inputs(dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, H, generator=g) * 3).to(dtype)
    res = torch.randn(T, H, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(dtype)
    scale = torch.tensor(0.02)  # static activation scale: |y| up to ~9 -> within e4m3's 448
    wq = (torch.randn(32, H, generator=g) * 8).to(FP8)
    ws = torch.tensor(0.05)
    return x, res, w, scale, wq, ws, ws.expand(1, 32).contiguous()


def _compile(fn, args, fusion, mode="eager"):
    torch._dynamo.reset()
    be = oc.backend(mode=mode, fusion=fusion)
    with torch.no_grad():
        out = torch.compile(fn, backend=be, fullgraph=True)(*args)
    return out, be.last_record


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn", list(PATTERNS), ids=lambda f: f.__name__)
def test_quant_fusion_fires_and_matches_the_unfused_graph(fn, dtype):
    fired, fused_op = PATTERNS[fn]
    args = _inputs(dtype)
    want, plain = _compile(fn, args, fusion=False)
    assert plain.fusions == {}
    assert fused_op not in plain.by_op()
    got, record = _compile(fn, args, fusion=True)
    assert record.fusions == fired, record
    lowered = record.by_op()
    assert lowered.get(fused_op) == [lowered[fused_op][0]], record  # one fused node
    assert not set(lowered) & UNFUSED, f"unfused ops left: {record}"
    assert record.fusion_misses == {}, record
    tolerance = fp8_chain_tolerance(fused_op, dtype)
    assert tolerance[0] >= 0 and 0.0 <= tolerance[1] < 0.1, tolerance  # declared, and tight
    _assert_close(got, want, f"{fn.__name__} {dtype}", tolerance)
    if lowered[fused_op] == ["native"] and fused_op not in ROUNDS_ONCE:
        for a, b in zip(got, want, strict=True):  # the fused native function is the chain
            assert torch.equal(_bits(a), _bits(b))
    # the eager (uncompiled) call agrees too: the fusion changes nothing a user relies on
    with torch.no_grad():
        _assert_close(got, fn(*args), f"{fn.__name__} {dtype} vs eager", tolerance)


def test_no_fusion_when_the_intermediate_escapes_and_the_record_says_why():
    def escapes(x, res, w, scale, wq, ws, ws_row):
        y = ops.rms_norm(x, w, 1e-6)
        q = ops.scaled_fp8_quant(y, scale)
        return q, y * 2  # the normalized value is needed in full precision too

    def escapes_dynamic(x, res, w, scale, wq, ws, ws_row):
        h = ops.silu_and_mul(torch.cat([x, res], -1))
        q, s = ops.per_token_group_quant_fp8(h, 32)
        return q, s, h.sum()

    for fn, pass_name in (
        (escapes, "fuse_rms_norm_static_fp8_quant"),
        (escapes_dynamic, "fuse_silu_and_mul_per_token_group_fp8_quant"),
    ):
        args = _inputs(torch.float32)
        want, _ = _compile(fn, args, fusion=False)
        got, record = _compile(fn, args, fusion=True)
        assert record.fusions == {}, record
        misses = record.fusion_misses.get(pass_name)
        assert misses and len(misses) == 1, record
        assert "is also used by" in misses[0] and "test_compile_quant_fusion.py" in misses[0]
        assert "not fused" in str(record)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.float(), b.float())  # the same graph ran


def test_no_fusion_for_arguments_the_fused_op_lacks():
    def variance(x, res, w, scale, wq, ws, ws_row):
        return ops.scaled_fp8_quant(ops.rms_norm(x, w, 1e-6, 32), scale)

    def column_major(x, res, w, scale, wq, ws, ws_row):
        return ops.per_token_group_quant_fp8(ops.silu_and_mul(torch.cat([x, res], -1)), 32, True)

    for fn, pass_name, text in (
        (variance, "fuse_rms_norm_static_fp8_quant", "variance_size"),
        (column_major, "fuse_silu_and_mul_per_token_group_fp8_quant", "column_major_scales"),
    ):
        _, record = _compile(fn, _inputs(torch.float32), fusion=True)
        assert record.fusions == {}, record
        assert text in record.fusion_misses[pass_name][0], record


def test_no_fusion_when_the_fused_op_refuses_the_arguments():
    """A fused op whose validator refuses the arguments (here: one installed for the test)
    is not created; the record carries the validator's message."""
    op = ops.rms_norm_static_fp8_quant
    original = op.validator

    def refuse(x, weight, epsilon, scale):
        raise ValueError("rms_norm_static_fp8_quant: refused by the test's validator")

    op.register_validator(refuse)
    try:
        _, record = _compile(rms_static, _inputs(torch.float32), fusion=True)
    finally:
        op.register_validator(original)
    assert record.fusions == {}, record
    (miss,) = record.fusion_misses["fuse_rms_norm_static_fp8_quant"]
    assert "not usable here" in miss and "refused by the test's validator" in miss
    assert record.by_op().keys() >= {"rms_norm", "scaled_fp8_quant"}


def test_fusion_subset_runs_only_those_passes_and_is_in_the_cache_key():
    args = _inputs(torch.float32)
    only = ["fuse_add_rms_norm"]
    _, record = _compile(add_rms_static, args, fusion=only)
    assert record.fusion_passes == only and record.fusions == {"fuse_add_rms_norm": 1}
    assert "fused_add_rms_norm" in record.by_op() and "scaled_fp8_quant" in record.by_op()

    keys = {
        "all": oc.backend(mode="eager", fusion=True).cache_key(),
        "none": oc.backend(mode="eager", fusion=False).cache_key(),
        "add": oc.backend(mode="eager", fusion=only).cache_key(),
        "add+quant": oc.backend(
            mode="eager", fusion=["fuse_add_rms_norm", "fuse_add_rms_norm_static_fp8_quant"]
        ).cache_key(),
    }
    assert len(set(keys.values())) == len(keys), keys
    # the same subset named in another order is the same pipeline
    same = oc.backend(
        mode="eager", fusion=["fuse_add_rms_norm_static_fp8_quant", "fuse_add_rms_norm"]
    )
    assert same.cache_key() == keys["add+quant"]
    material = oc.key_material(oc.backend().config, mode="eager", fusion=True)
    assert "fuse_rms_norm_static_fp8_quant" in dict(material["fusion_passes"])
    assert "opcore.compile.passes.fuse_quant" in material["pipeline"]
    with pytest.raises(ValueError, match="unknown fusion pass.*'fuse_nothing'.*registered"):
        oc.backend(fusion=["fuse_nothing"])


def test_quant_fusion_under_inductor():
    args = _inputs(torch.bfloat16)
    want, _ = _compile(add_rms_dynamic, args, fusion=False, mode="inductor")
    got, record = _compile(add_rms_dynamic, args, fusion=True, mode="inductor")
    assert record.fusions == {
        "fuse_add_rms_norm": 1,
        "fuse_add_rms_norm_dynamic_per_token_quant": 1,
    }, record
    assert "rms_norm_dynamic_per_token_quant" in record.by_op()
    tolerance = fp8_tolerance("rms_norm_dynamic_per_token_quant", torch.bfloat16)
    _assert_close(got, want, "add_rms_dynamic under inductor", tolerance)


def test_fused_node_placement_with_a_scale_computed_between_norm_and_quant():
    """The fused op needs the scale, computed after the norm here: it goes where the
    quantization was, unless a value it replaces (the residual sum) is read before that."""

    def late_scale(x, res, w, scale, wq, ws, ws_row):
        y, s = ops.fused_add_rms_norm(x, res, w, 1e-6)
        late = scale * 2.0
        return ops.scaled_fp8_quant(y, late), s

    def residual_read_first(x, res, w, scale, wq, ws, ws_row):
        y, s = ops.fused_add_rms_norm(x, res, w, 1e-6)
        t = s * 3.0  # the residual sum is read before the scale exists
        late = scale * 2.0
        return ops.scaled_fp8_quant(y, late), t

    args = _inputs(torch.bfloat16)
    want, _ = _compile(late_scale, args, fusion=False)
    got, record = _compile(late_scale, args, fusion=True)
    assert record.fusions == {"fuse_add_rms_norm_static_fp8_quant": 1}, record
    for a, b in zip(got, want, strict=True):
        assert torch.equal(_bits(a), _bits(b))

    want, _ = _compile(residual_read_first, args, fusion=False)
    got, record = _compile(residual_read_first, args, fusion=True)
    assert record.fusions == {}, record
    (miss,) = record.fusion_misses["fuse_add_rms_norm_static_fp8_quant"]
    assert "computed after the producer" in miss, miss
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.float(), b.float())


def test_the_silu_fusion_rounds_once_within_the_chain_budget():
    """``fuse_silu_and_mul_fp8_quant`` rewrites the chain (the product rounded to bf16,
    then quantized) to an op that quantizes the fp32 product: bf16 rounding moves some
    values across an e4m3 rounding boundary, so the two differ, by one code on fewer
    elements than the chain budget, which is the fused op's own budget (1 %) plus the
    intermediate's rounding."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(64, 512, generator=g) * 3).to(torch.bfloat16)
    s = torch.tensor(0.02)

    def silu_q(x, s):
        return ops.scaled_fp8_quant(ops.silu_and_mul(x), s)

    want, _ = _compile(silu_q, (x, s), fusion=False)
    got, record = _compile(silu_q, (x, s), fusion=True)
    assert record.fusions == {"fuse_silu_and_mul_fp8_quant": 1}, record
    steps = (_ordinal(got) - _ordinal(want)).abs()
    off = float((steps > 0).float().mean())
    assert int(steps.max()) == 1 and 0.002 < off < 0.03, off  # about 1.6 % expected
    assert torch.equal(_bits(got), _bits(ops.scaled_fp8_quant(ops.silu_and_mul(x.float()), s)))
    own = fp8_tolerance("silu_and_mul_fp8_quant", torch.bfloat16)
    chain = fp8_chain_tolerance("silu_and_mul_fp8_quant", torch.bfloat16)
    assert own == (1, 0.01) and chain == (1, 0.04), (own, chain)
    assert fp8_chain_tolerance("rms_norm_static_fp8_quant", torch.bfloat16) == fp8_tolerance(
        "rms_norm_static_fp8_quant", torch.bfloat16
    )


def test_quant_fusions_fire_states_the_chain_budget():
    """conformance's ``compile.quant_fusion`` body on the CPU (native fused ops): every
    pass fires, the outputs are within their budget against the unfused chain, and the
    metrics name that budget for each fused op."""
    from opcore.compile.testing import quant_fusions_fire

    m = quant_fusions_fire(mode="eager", dtype=torch.bfloat16)
    assert set(m["fusions"].values()) == {1}, m
    budgets = m["fp8_budgets"]
    assert budgets["silu_and_mul_fp8_quant"] == (1, 0.04), budgets
    for op_name, budget in budgets.items():
        assert budget == fp8_chain_tolerance(op_name, torch.bfloat16), op_name


def test_compiled_matches_eager_on_rows_with_nan_and_inf():
    """conformance's ``compile.matches_eager`` body on the fp8 ops' NaN / inf samples:
    NaN where eager has NaN counts as equal (codes, scales and residual sums)."""
    from opcore.compile.testing import CompileCheckFailed, compiled_matches_eager
    from opcore.ir.samples import SampleInput

    nan, inf = float("nan"), float("inf")
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(8))
    x[1, 3], x[2, 5], x[3, 0] = nan, inf, -inf
    r, w, s = torch.randn(4, 64), torch.ones(64), torch.tensor([0.01])
    cases = [
        ("fused_add_rms_norm_static_fp8_quant", (x, r, w, 1e-6, s)),
        ("rms_norm_dynamic_per_token_quant", (x, w, 1e-6, r)),
        ("dynamic_per_token_scaled_fp8_quant", (x,)),
        ("silu_and_mul_fp8_quant", (x, s)),
    ]
    for name, args in cases:
        m = compiled_matches_eager(name, "native", SampleInput("nonfinite", args))
        assert m["max_abs_err"] == 0.0, (name, m)
    # and a NaN where eager has a number is still a difference
    from opcore.compile import testing

    with pytest.raises(CompileCheckFailed, match="NaN where"):
        testing._compare("planted", (torch.tensor([1.0, nan]),), (torch.tensor([1.0, 2.0]),),
                         0.0, 0.0)  # fmt: skip
    q = torch.tensor([1.0, nan]).to(FP8)
    with pytest.raises(CompileCheckFailed, match="codes off"):
        testing._compare("planted", (q,), (torch.tensor([1.0, 2.0]).to(FP8),), 0.0, 0.0)
