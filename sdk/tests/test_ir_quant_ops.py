"""The fp8 quantization ops: each against a reference written from the math in float64
(its own round-to-nearest-even onto the fp8 grid, not torch's conversion), the rounding and
saturation rules on hand-picked values, the one rule for NaN and infinities, the platform's
fp8 dtype, the fused ops equal to their unfused chains (silu_and_mul_fp8_quant: rounded
once), validators, fakes and opcheck."""

from __future__ import annotations

import math

import pytest
import torch

from opcore.ir import all_ops, ops
from opcore.ir.tolerances import fp8_tolerance
from opcore.platforms import get_current_platform

E4M3 = torch.float8_e4m3fn
MIN_SCALE = 2.0**-126


# --------------------------------------------------------------------------- the reference
def ref_rms_norm(x, weight, epsilon):
    rows = x.double().reshape(-1, x.shape[-1])
    out = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        out[i] = rows[i] / math.sqrt(float((rows[i] * rows[i]).mean()) + epsilon)
        if weight is not None:
            out[i] *= weight.double()
    return out.reshape(x.shape)


def ref_silu_and_mul(x):
    d = x.shape[-1] // 2
    a, b = x.double()[..., :d], x.double()[..., d:]
    return a / (1.0 + torch.exp(-a)) * b


def produces_fp8(op) -> bool:
    """Whether ``op``'s outputs (on its first sample, through its fake) hold an fp8 tensor."""
    sample = next(iter(op.sample_inputs("cpu", torch.float32))).to("meta")
    out = op.fake_impl(*sample.args, **sample.kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    return any(o is not None and o.dtype.itemsize == 1 and o.is_floating_point() for o in outs)


def fp8_grid(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite value of ``dtype`` (float64, ascending) and its code's lowest bit."""
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(dtype).to(torch.float64)
    keep = torch.isfinite(values) & ~((values == 0) & (codes >= 128))  # one zero
    values, codes = values[keep], codes[keep]
    order = torch.argsort(values)
    return values[order], (codes[order] & 1).to(torch.bool)


def round_fp8(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``v`` (float64) saturated to ``dtype``'s range (infinities included) and rounded to
    its nearest value, ties to the value whose code is even; NaN stays NaN; float64."""
    grid, odd = fp8_grid(dtype)
    flat = v.reshape(-1).clamp(float(grid[0]), float(grid[-1]))
    nan = torch.isnan(flat)
    flat = torch.where(nan, 0.0, flat)
    hi = torch.searchsorted(grid, flat).clamp(1, grid.numel() - 1)
    lo = hi - 1
    d_lo, d_hi = flat - grid[lo], grid[hi] - flat
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & odd[lo])
    out = torch.where(pick_hi, grid[hi], grid[lo])
    return torch.where(nan, math.nan, out).reshape(v.shape)


def _q(y, scale, dtype=E4M3):
    return round_fp8(y.double() / scale.double(), dtype)


def finite_amax(y: torch.Tensor) -> torch.Tensor:
    """The largest ``|y|`` over the finite elements of the last dim (0 if none), kept."""
    a = y.double().abs()
    return torch.where(torch.isfinite(a), a, 0.0).amax(-1, keepdim=True)


def _dyn(y, amax, scale_ub=None):
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.double().reshape(()))
    # the float32 division the ops make (amax is a float32 value here)
    scales = (amax.to(torch.float32) / 448.0).clamp_min(MIN_SCALE)
    return _q(y, scales), scales


def _rounded(y, x):
    return y.to(x.dtype).double()


def ref_scaled(x, scale):
    return _q(x, scale)


def ref_dynamic(x, scale_ub=None):
    return _dyn(x, finite_amax(x), scale_ub)


def ref_group(x, group_size=128, column_major_scales=False):
    g = x.double().reshape(*x.shape[:-1], -1, group_size)
    q, s = _dyn(g, finite_amax(g))
    s = s.squeeze(-1)
    return q.reshape(x.shape), s.movedim(-1, 0) if column_major_scales else s


def ref_norm_static(x, weight, epsilon, scale):
    return _q(_rounded(ref_rms_norm(x, weight, epsilon), x), scale)


def ref_add_norm_static(x, residual, weight, epsilon, scale):
    res = (x.double() + residual.double()).to(x.dtype)
    return _q(_rounded(ref_rms_norm(res, weight, epsilon), x), scale), res.double()


def ref_norm_dynamic(x, weight, epsilon, residual=None, scale_ub=None):
    res = None if residual is None else (x.double() + residual.double()).to(x.dtype)
    y = _rounded(ref_rms_norm(x if res is None else res, weight, epsilon), x)
    q, s = _dyn(y, finite_amax(y), scale_ub)
    return q, s, None if res is None else res.double()


def ref_silu_static(x, scale):
    return _q(ref_silu_and_mul(x), scale)  # rounded once: no intermediate in x's dtype


def ref_silu_group(x, group_size=128):
    y = _rounded(ref_silu_and_mul(x), x)
    return ref_group(y, group_size)


QUANT_REFERENCES = {
    "scaled_fp8_quant": ref_scaled,
    "dynamic_per_token_scaled_fp8_quant": ref_dynamic,
    "per_token_group_quant_fp8": ref_group,
    "rms_norm_static_fp8_quant": ref_norm_static,
    "fused_add_rms_norm_static_fp8_quant": ref_add_norm_static,
    "rms_norm_dynamic_per_token_quant": ref_norm_dynamic,
    "silu_and_mul_fp8_quant": ref_silu_static,
    "silu_and_mul_per_token_group_fp8_quant": ref_silu_group,
}


def code_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many fp8 values apart ``a`` and ``b`` (one fp8 dtype) are, elementwise; NaN
    and NaN are 0 apart, NaN and a number 1000."""

    def ordinal(t):
        bits = t.contiguous().view(torch.uint8).to(torch.int32)
        mag = bits & 0x7F
        return torch.where(bits >= 128, -mag, mag)

    nan_a, nan_b = torch.isnan(a.float()), torch.isnan(b.float())
    d = torch.where(nan_a & nan_b, 0, (ordinal(a) - ordinal(b)).abs())
    return torch.where(nan_a != nan_b, 1000, d)


# --------------------------------------------------------------------------- tests
def test_every_fp8_op_has_a_reference():
    assert set(QUANT_REFERENCES) == {n for n, op in all_ops().items() if produces_fp8(op)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op_name", sorted(QUANT_REFERENCES))
def test_quant_op_matches_reference(op_name, dtype):
    op = getattr(ops, op_name)
    max_ulps, fraction = fp8_tolerance(op_name, dtype)
    atol, rtol = op.tolerance(dtype)
    off = total = 0
    for sample in op.sample_inputs("cpu", dtype):
        got = op(*sample.args, **sample.kwargs)
        want = QUANT_REFERENCES[op_name](*sample.args, **sample.kwargs)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want), sample.name
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            where = f"{sample.name} output {i}"
            if w is None:
                assert g is None, where
                continue
            assert g.shape == w.shape and g.is_contiguous(), where
            if g.dtype == E4M3:
                d = code_distance(g, w.to(E4M3))
                assert int(d.max()) <= max_ulps, f"{where}: {int(d.max())} codes off"
                off += int((d > 0).sum())
                total += d.numel()
            else:
                torch.testing.assert_close(
                    g.double(), w.double(), atol=atol, rtol=rtol, equal_nan=True, msg=where
                )
    assert total and off <= fraction * total, f"{off}/{total} elements one code off"


def test_round_to_nearest_even_and_saturation():
    one = torch.ones(1)
    x = torch.tensor(
        [
            1.0625,  # tie 1.0 / 1.125: the even code, 1.0
            1.1875,  # tie 1.125 / 1.25: 1.25
            17.0,  # tie 16 / 18: 16
            19.0,  # tie 18 / 20: 20
            2.0**-10,  # tie 0 / the smallest subnormal: 0
            3 * 2.0**-10,  # tie between the first two subnormals: the even one, 2**-8
            464.0,  # tie 448 / (480 beyond the range): saturates to 448
            1e30,
            -float("inf"),
            -0.0,
        ]
    )
    q = ops.scaled_fp8_quant(x, one)
    assert q.dtype == E4M3
    want = [1.0, 1.25, 16.0, 20.0, 0.0, 2.0**-8, 448.0, 448.0, -448.0, -0.0]
    assert q.float().tolist() == want
    assert torch.isnan(ops.scaled_fp8_quant(torch.tensor([float("nan")]), one).float()).all()


def test_reciprocal_scale_convention():
    x = torch.tensor([[3.0, -1.5, 0.25, 0.0]])
    q, s = ops.dynamic_per_token_scaled_fp8_quant(x)
    assert s.dtype == torch.float32 and s.shape == (1, 1)
    assert float(s) == pytest.approx(3.0 / 448.0, rel=1e-7)
    assert q.float()[0, 0] == 448.0  # the row's amax maps to fp8_max
    torch.testing.assert_close(q.float() * s, x, atol=0, rtol=0.07)  # x ≈ q * scale


def test_zero_rows_and_scale_ub():
    x = torch.zeros(3, 16)
    x[1] = torch.linspace(-4, 4, 16)
    q, s = ops.dynamic_per_token_scaled_fp8_quant(x, torch.tensor([1.0]))
    assert float(s[0]) == MIN_SCALE and (q[0].float() == 0).all()
    assert float(s[1]) == pytest.approx(1.0 / 448.0)
    assert q[1].float().abs().max() == 448.0  # rows above the bound saturate
    assert int((q[1].float().abs() == 448.0).sum()) == 12


def test_group_scales_layouts():
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(4))
    q, s = ops.per_token_group_quant_fp8(x, 64)
    qc, sc = ops.per_token_group_quant_fp8(x, 64, True)
    assert s.shape == (5, 4) and sc.shape == (4, 5) and sc.is_contiguous()
    assert torch.equal(sc.t(), s) and torch.equal(q.view(torch.uint8), qc.view(torch.uint8))
    back = (q.float().reshape(5, 4, 64) * s[..., None]).reshape(5, 256)
    # half an e4m3 ULP: 2**-4 of a normal value, 2**-10 of its scale among the subnormals
    torch.testing.assert_close(back, x, atol=float(s.max()) * 2**-10, rtol=2**-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_ops_equal_their_unfused_chains(dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 256, generator=g).to(dtype)
    r = torch.randn(6, 256, generator=g).to(dtype)
    w = (1 + torch.randn(256, generator=g) / 2).to(dtype)
    s = torch.tensor([0.01])
    ub = torch.tensor([2.0])

    def same(a, b):
        a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
        for u, v in zip(a, b, strict=True):
            assert u.dtype == v.dtype and torch.equal(u.view(torch.uint8), v.view(torch.uint8))

    same(
        ops.rms_norm_static_fp8_quant(x, w, 1e-6, s),
        ops.scaled_fp8_quant(ops.rms_norm(x, w, 1e-6), s),
    )
    y, res = ops.fused_add_rms_norm(x, r, w, 1e-6)
    same(
        ops.fused_add_rms_norm_static_fp8_quant(x, r, w, 1e-6, s),
        (ops.scaled_fp8_quant(y, s), res),
    )
    q, sc, none = ops.rms_norm_dynamic_per_token_quant(x, w, 1e-6, scale_ub=ub)
    assert none is None
    same((q, sc), ops.dynamic_per_token_scaled_fp8_quant(ops.rms_norm(x, w, 1e-6), ub))
    same(
        ops.rms_norm_dynamic_per_token_quant(x, w, 1e-6, r, ub),
        (*ops.dynamic_per_token_scaled_fp8_quant(y, ub), res),
    )
    # rounded once: the chain with the intermediate in fp32, not in x's dtype
    same(ops.silu_and_mul_fp8_quant(x, s), ops.scaled_fp8_quant(ops.silu_and_mul(x.float()), s))
    same(
        ops.silu_and_mul_per_token_group_fp8_quant(x, 64),
        ops.per_token_group_quant_fp8(ops.silu_and_mul(x), 64),
    )


def test_silu_and_mul_fp8_quant_rounds_once():
    """In fp16 at small magnitudes ``silu(gate) * up`` lies among fp16's subnormals, which
    hold fewer bits than an e4m3 code: rounded there first (the unfused chain) most of a
    row ends a code or more from the e4m3 rounding of the exact value. The fused op
    quantizes the fp32 product: the exact value's rounding, but for a tie flipped by the
    scale's rounding."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(8, 256, generator=g) * 1e-3).to(torch.float16)
    scale = torch.tensor([4.5e-6 / 448.0])
    exact = round_fp8(ref_silu_and_mul(x) / scale.double(), E4M3)
    got = code_distance(ops.silu_and_mul_fp8_quant(x, scale), exact.to(E4M3))
    assert int(got.max()) <= 1 and float((got > 0).float().mean()) <= 0.01, got.max()
    chain = ops.scaled_fp8_quant(ops.silu_and_mul(x), scale)  # what it was defined as
    assert float((code_distance(chain, exact.to(E4M3)) > 0).float().mean()) > 0.3
    max_ulps, fraction = fp8_tolerance("silu_and_mul_fp8_quant", torch.float16)
    assert (max_ulps, fraction) == (1, 0.01)  # no rounded intermediate in its budget


# --------------------------------------------------------------------------- NaN and inf
_NAN, _INF = math.nan, math.inf


def nonfinite_rows() -> torch.Tensor:
    """Six rows of eight: row 0 finite, rows 1-4 the same values with NaN / +inf / -inf
    / all three in place of some, row 5 nothing finite."""
    row = [0.3, -1.7, 2.9, 0.05, -0.6, 1.1, -2.2, 0.8]
    x = torch.tensor([row] * 6, dtype=torch.float32)
    x[1, 3] = _NAN  # not the row's amax (2.9, column 2)
    x[2, 5] = _INF
    x[3, 0] = -_INF
    x[4, 1], x[4, 4], x[4, 7] = _NAN, _INF, -_INF
    x[5] = torch.tensor([_NAN, _INF, -_INF] * 3)[:8]
    return x


def rule_static(y, scale):
    """The rule for a static scale: ``sat(round(y / scale))``, ±inf to ±448, NaN kept."""
    return round_fp8(y.double() / scale.double(), E4M3)


def rule_dynamic(y, group=None):
    """The rule for dynamic scales (per row, or per ``group`` columns): the scale from the
    finite elements' amax (0 if none), then as static. Returns (q as float64, scales)."""
    g = y if group is None else y.reshape(*y.shape[:-1], -1, group)
    scales = (finite_amax(g).to(torch.float32) / 448.0).clamp_min(MIN_SCALE)
    q = round_fp8(g.double() / scales.double(), E4M3).reshape(y.shape)
    return q, scales if group is None else scales.squeeze(-1)


def _nonfinite_cases():
    """(op name, its outputs on NaN / inf rows, what the rule gives) for every fp8 op; the
    fused ops' rule is applied to their producer's output (fp32 inputs: the norm and the
    activation output need no rounding)."""
    x = nonfinite_rows()
    r = torch.linspace(-1, 1, 48).reshape(6, 8)
    w = torch.linspace(0.5, 1.5, 8)
    s = torch.tensor([0.01])
    gated = torch.cat([x, x.flip(0)], dim=-1)  # NaN / inf in the gate and in the up half
    y = ops.rms_norm(x, w, 1e-6)
    ya, res = ops.fused_add_rms_norm(x, r, w, 1e-6)
    h = ops.silu_and_mul(gated)
    return [
        ("scaled_fp8_quant", ops.scaled_fp8_quant(x, s), (rule_static(x, s),)),
        ("dynamic_per_token_scaled_fp8_quant", ops.dynamic_per_token_scaled_fp8_quant(x),
         rule_dynamic(x)),
        ("per_token_group_quant_fp8", ops.per_token_group_quant_fp8(x, 4), rule_dynamic(x, 4)),
        ("rms_norm_static_fp8_quant", ops.rms_norm_static_fp8_quant(x, w, 1e-6, s),
         (rule_static(y, s),)),
        ("fused_add_rms_norm_static_fp8_quant",
         ops.fused_add_rms_norm_static_fp8_quant(x, r, w, 1e-6, s), (rule_static(ya, s), res)),
        ("rms_norm_dynamic_per_token_quant", ops.rms_norm_dynamic_per_token_quant(x, w, 1e-6)[:2],
         rule_dynamic(y)),
        ("rms_norm_dynamic_per_token_quant",
         ops.rms_norm_dynamic_per_token_quant(x, w, 1e-6, r), (*rule_dynamic(ya), res)),
        ("silu_and_mul_fp8_quant", ops.silu_and_mul_fp8_quant(gated, s), (rule_static(h, s),)),
        ("silu_and_mul_per_token_group_fp8_quant",
         ops.silu_and_mul_per_token_group_fp8_quant(gated, 4), rule_dynamic(h, 4)),
    ]  # fmt: skip


def test_nan_and_inf_follow_one_rule_in_every_fp8_op():
    """Elementwise ±inf saturates to ±448 and NaN stays NaN; a dynamic scale comes from the
    finite elements only (finite, never NaN: MIN_SCALE where none is finite). The norm's
    output is NaN across a row holding NaN and 0 (NaN where the inf was) across a row
    holding an infinity, by IEEE arithmetic; the rule then applies to it."""
    cases = _nonfinite_cases()
    assert {name for name, _, _ in cases} == set(QUANT_REFERENCES)
    for name, got, want in cases:
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(want), name
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            where = f"{name} output {i}"
            if g.dtype == E4M3:
                assert torch.equal(torch.isnan(g.float()), torch.isnan(w)), where
                assert int(code_distance(g, w.to(E4M3)).max()) == 0, f"{where}: {g} vs {w}"
            else:
                assert torch.equal(torch.isnan(g), torch.isnan(w.to(g.dtype))), where
                assert torch.equal(g.nan_to_num(), w.to(g.dtype).nan_to_num()), where
    # spelled out on the per-token op: NaN and inf change neither the scale nor the codes
    # of a row's other elements
    q, scales = ops.dynamic_per_token_scaled_fp8_quant(nonfinite_rows())
    assert torch.isfinite(scales).all() and float(scales[5]) == MIN_SCALE
    assert torch.equal(scales[:5], scales[:1].expand(5, 1))
    codes = q.float()
    for row in range(1, 5):
        finite = torch.isfinite(nonfinite_rows()[row])
        assert torch.equal(codes[row][finite], codes[0][finite]), row
    assert codes[2, 5] == 448.0 and codes[3, 0] == -448.0 and torch.isnan(codes[1, 3])
    assert codes[5].tolist()[1:3] == [448.0, -448.0] and torch.isnan(codes[5, 0])
    # the static op saturates an infinity the same way
    qs = ops.scaled_fp8_quant(nonfinite_rows(), torch.tensor([0.01])).float()
    assert qs[2, 5] == 448.0 and qs[3, 0] == -448.0 and torch.isnan(qs[1, 3])


def test_every_fp8_op_has_nan_and_inf_samples():
    """The conformance samples hold rows with NaN and with ±inf for every fp8 op and dtype,
    so each provider is compared with the reference on them (NaN must match NaN)."""
    for name in QUANT_REFERENCES:
        op = getattr(ops, name)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for quick in (True, False):
                xs = [s.args[0] for s in op.sample_inputs("cpu", dtype, quick=quick)]
                assert any(torch.isnan(x).any() for x in xs), (name, dtype, quick)
                assert any((x == _INF).any() for x in xs), (name, dtype, quick)
                assert any((x == -_INF).any() for x in xs), (name, dtype, quick)


def test_the_platform_declares_the_fp8_dtype(monkeypatch):
    """A platform declaring ``float8_e4m3fnuz`` (as the ROCm plugin does on MI300) gets
    that dtype, its range (240) and its rounding; one declaring none gets e4m3fn."""
    platform_cls = type(get_current_platform())
    x = torch.tensor([[1.0625, 300.0, -1e9, 2.0**-11, 0.0]])
    one = torch.ones(1)
    monkeypatch.setattr(platform_cls, "fp8_dtype", None)
    assert ops.scaled_fp8_quant(x, one).dtype == E4M3
    monkeypatch.setattr(platform_cls, "fp8_dtype", torch.float8_e4m3fnuz)
    q = ops.scaled_fp8_quant(x, one)
    assert q.dtype == torch.float8_e4m3fnuz
    want = round_fp8(x.double(), torch.float8_e4m3fnuz)
    assert want[0, 1] == 240.0 and want[0, 2] == -240.0
    assert torch.equal(q.double(), want)
    qd, sd = ops.dynamic_per_token_scaled_fp8_quant(x)
    assert float(sd) == pytest.approx(1e9 / 240.0) and qd.dtype == torch.float8_e4m3fnuz
    fake = ops.scaled_fp8_quant.fake_impl(x.to("meta"), one.to("meta"))
    assert fake.dtype == torch.float8_e4m3fnuz
    monkeypatch.setattr(platform_cls, "fp8_dtype", torch.float8_e5m2)
    with pytest.raises(ValueError, match="float8_e5m2"):
        ops.scaled_fp8_quant(x, one)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: ops.scaled_fp8_quant(torch.ones(2, 4), torch.ones(1, dtype=torch.float16)),
            "scaled_fp8_quant: argument 'scale': dtype float16 is not float32",
        ),
        (
            lambda: ops.scaled_fp8_quant(torch.ones(2, 4), torch.ones(2)),
            "argument 'scale': has shape \\(2,\\); expected one element",
        ),
        (
            lambda: ops.scaled_fp8_quant(torch.ones(2, 4), 0.5),
            "argument .scale.: expected a Tensor, got float",
        ),
        (
            lambda: ops.scaled_fp8_quant(torch.ones(2, 4, dtype=torch.int32), torch.ones(1)),
            "argument 'x': dtype int32",
        ),
        (
            lambda: ops.dynamic_per_token_scaled_fp8_quant(torch.ones(2, 0)),
            "argument 'x': last dim is 0",
        ),
        (
            lambda: ops.dynamic_per_token_scaled_fp8_quant(torch.ones(2, 4), torch.ones(1, 1, 2)),
            "argument 'scale_ub'",
        ),
        (
            lambda: ops.per_token_group_quant_fp8(torch.ones(2, 96), 64),
            "argument 'group_size': is 64; it must divide the last dim of 'x' \\(96\\)",
        ),
        (
            lambda: ops.per_token_group_quant_fp8(torch.ones(2, 96), 0),
            "argument 'group_size': is 0; expected a positive int",
        ),
        (
            lambda: ops.per_token_group_quant_fp8(torch.ones(2, 96), 32, 1),
            "argument 'column_major_scales': expected a bool",
        ),
        (
            lambda: ops.rms_norm_static_fp8_quant(
                torch.ones(2, 8), torch.ones(4), 1e-6, torch.ones(1)
            ),
            "argument 'weight'",
        ),
        (
            lambda: ops.rms_norm_static_fp8_quant(torch.ones(2, 8), None, -1.0, torch.ones(1)),
            "argument 'epsilon'",
        ),
        (
            lambda: ops.fused_add_rms_norm_static_fp8_quant(
                torch.ones(2, 8), torch.ones(3, 8), None, 1e-6, torch.ones(1)
            ),
            "argument 'residual': has shape \\(3, 8\\)",
        ),
        (
            lambda: ops.rms_norm_dynamic_per_token_quant(
                torch.ones(2, 8), None, 1e-6, torch.ones(2, 8, dtype=torch.float16)
            ),
            "argument 'residual': dtype float16 differs",
        ),
        (
            lambda: ops.silu_and_mul_fp8_quant(torch.ones(2, 7), torch.ones(1)),
            "silu_and_mul_fp8_quant: argument 'x': last dim is 7",
        ),
        (
            lambda: ops.silu_and_mul_per_token_group_fp8_quant(torch.ones(2, 128), 128),
            "it must divide half the last dim of 'x' \\(64\\)",
        ),
    ],
)
def test_validators_name_the_argument(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@pytest.mark.parametrize("op_name", sorted(QUANT_REFERENCES))
def test_fake_matches_native_and_opcheck(op_name):
    op = getattr(ops, op_name)
    samples = list(op.sample_inputs("cpu", torch.bfloat16))
    for sample in samples[:3] + [s for s in samples if "strided" in s.name or "kwargs" in s.name]:
        real = op(*sample.args, **sample.kwargs)
        meta = sample.to("meta")
        fake = op.fake_impl(*meta.args, **meta.kwargs)
        real = real if isinstance(real, tuple) else (real,)
        fake = fake if isinstance(fake, tuple) else (fake,)
        for r, f in zip(real, fake, strict=True):
            assert (r is None) == (f is None), sample.name
            if r is not None:
                assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride())
        torch.library.opcheck(op.torch_op, sample.args, sample.kwargs)
