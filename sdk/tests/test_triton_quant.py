"""The Triton fp8 kernels (`opcore.kernels.triton.quant`) under Triton's CPU interpreter.

Each provider against the op's native function on every quick sample (fp32, fp16, bf16):
at most one fp8 code apart on at most the op's declared fraction of elements, scales
within float32 rounding, residual sums bit for bit; the fp32 -> fp8 rounding against
torch's conversion over every fp8 value, every midpoint and random values in every
binade; rows longer than one register tile (the three-pass path); the choice of provider;
a platform declaring ``float8_e4m3fnuz``; rows holding NaN and infinities (one rule with
native: the scale from the finite elements, ±inf saturated, NaN kept);
`silu_and_mul_fp8_quant` rounding once (fp16 products among fp16's subnormals). And,
outside the interpreter, the kernels compiled for sm_90 and gfx942 as a GPU would (no GPU
needed to compile).
As in test_triton_kernels.py, the collected test re-runs this file in a child pytest with
``TRITON_INTERPRET=1`` (the interpreter must be on before the kernels are decorated).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opcore.testing.interpreter import UNDER_TRITON_INTERPRETER, rerun_under_triton_interpreter

QUANT_OPS = (
    "scaled_fp8_quant",
    "dynamic_per_token_scaled_fp8_quant",
    "per_token_group_quant_fp8",
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
    "rms_norm_dynamic_per_token_quant",
    "silu_and_mul_fp8_quant",
    "silu_and_mul_per_token_group_fp8_quant",
)

# Compiles (no GPU: Triton's frontend, then ptxas / the AMD linker its wheel ships) the
# kernel variants that differ most: gated and fnuz, every row-kernel flag in both the one-
# and the three-pass form, gated groups. In a child, like every module that builds kernels.
_AOT = """
import torch
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from opcore.kernels.triton import quant
I = "i32"
static = dict(x_ptr="*bf16", x_stride=I, scale_ptr="*fp32", n_rows=I, d=I)
group = dict(x_ptr="*fp16", x_stride=I, s_ptr="*fp32", n_groups_total=I, groups=I,
             group_size=I, d=I, s_row_stride=I, s_group_stride=I)
rows = dict(x_ptr="*bf16", x_stride=I, r_ptr="*bf16", r_stride=I, w_ptr="*bf16",
            res_ptr="*bf16", scale_ptr="*fp32", s_ptr="*fp32", n_rows=I, n_cols=I, eps="fp32")
targets = []
if "nvidia" in backends:
    targets.append((GPUTarget("cuda", 90, 32), torch.float8_e4m3fn, "*fp8e4nv"))
if "amd" in backends:
    targets.append((GPUTarget("hip", "gfx942", 64), torch.float8_e4m3fnuz, "*fp8e4b8"))
built = 0
for target, dtype, fp8_ptr in targets:
    fmt = quant.fp8_format(dtype)
    # codes in integers, or the device's conversion after a clamp, or saturating alone
    for encode, saturates in ((True, False), (False, False), (False, True)):
        q = {"q_ptr": "*u8" if encode else fp8_ptr}
        modes = dict(**fmt, ENCODE=encode, EMULATE=False, SATURATES=saturates)
        variants = [
            (quant._static_kernel, {**static, **q}, dict(GATED=True, BLOCK_C=1024, ROWS=4)),
            (quant._group_quant_kernel, {**group, **q},
             dict(GATED=True, MIN_SCALE=quant.MIN_SCALE, BLOCK_S=128, GROUPS=16)),
        ]
        for single in (True, False):
            variants.append((quant._row_quant_kernel, {**rows, **q}, dict(HAS_RESIDUAL=True,
                NORM=True, HAS_WEIGHT=True, DYNAMIC=True, HAS_UB=True, MIN_SCALE=quant.MIN_SCALE,
                BLOCK_N=4096, ROWS=1, SINGLE_PASS=single, N_CHUNKS=1 if single else 5)))
        for kernel, sig, consts in variants:
            consts = {**consts, **modes}
            full = {**sig, **{k: "constexpr" for k in consts}}
            out = compile(ASTSource(fn=kernel, signature=full, constexprs=consts), target=target)
            assert {"cubin", "hsaco"} & set(out.asm), sorted(out.asm)
            if target.backend == "cuda" and not encode:
                # what fp8_convert_saturates declares for the CUDA platform: every
                # conversion to e4m3 is the saturating one
                ptx = out.asm["ptx"]
                assert "cvt.rn.satfinite.e4m3x2.f32" in ptx, kernel.fn.__name__
                assert "cvt.rn.e4m3x2" not in ptx, kernel.fn.__name__
            built += 1
print("compiled", built)
"""


if not UNDER_TRITON_INTERPRETER:

    def test_triton_quant_kernels_under_interpreter():
        rerun_under_triton_interpreter(__file__)

    def test_kernels_compile_for_hopper_and_mi300_without_a_gpu():
        """The interpreter runs the kernels as Python; this builds them as a GPU would
        (sm_90 cubin, gfx942 code object), so a construct only the compiler rejects fails
        here rather than on the device."""
        pytest.importorskip("triton")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        proc = subprocess.run(
            [sys.executable, "-c", _AOT], capture_output=True, text=True, timeout=600, env=env
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert proc.stdout.strip().startswith("compiled "), proc.stdout

    def test_a_saturating_conversion_drops_the_clamp_from_every_kernel(tmp_path):
        """`bench/fp8_sass.py` compiles each quant kernel for sm_90 both ways: without the
        clamp each issues fewer instructions (the point of ``fp8_convert_saturates``)."""
        pytest.importorskip("triton")
        script = Path(__file__).resolve().parents[2] / "bench" / "fp8_sass.py"
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        out = tmp_path / "sass.json"
        proc = subprocess.run(
            [sys.executable, str(script), "--json", str(out)],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        rows = json.loads(out.read_text())
        assert len(rows) == 5
        for row in rows:
            assert 0 < row["saturating"] < row["clamp"], row

    @pytest.mark.parametrize("declared", [False, True])
    def test_the_clamp_is_skipped_only_where_the_platform_conversion_saturates(
        declared, monkeypatch
    ):
        """``SATURATES`` (no clamp before the conversion) follows the platform's
        ``fp8_convert_saturates``, and never applies when the kernels encode the codes
        themselves (their encoder saturates in its own arithmetic)."""
        pytest.importorskip("triton")
        from opcore.kernels.triton import quant
        from opcore.platforms import get_current_platform

        cls = type(get_current_platform())
        e4m3 = torch.float8_e4m3fn
        monkeypatch.setattr(cls, "fp8_dtype", e4m3)
        monkeypatch.setattr(cls, "fp8_convert_saturates", declared)
        assert quant._modes(e4m3)["ENCODE"] is False
        assert quant._modes(e4m3)["SATURATES"] is declared
        with quant.codes_encoded():
            assert quant._modes(e4m3) == {"ENCODE": True, "EMULATE": False, "SATURATES": False}
        # another fp8 dtype than the platform's: encoded, so clamped by the encoder
        assert quant._modes(torch.float8_e5m2)["SATURATES"] is False

else:
    pytest.importorskip("triton")
    from opcore.ir import invalidate_caches, ops
    from opcore.ir.tolerances import fp8_tolerance
    from opcore.kernels.triton import quant
    from opcore.kernels.triton._launch import MAX_FUSED_COLS
    from opcore.platforms import get_current_platform

    E4M3 = torch.float8_e4m3fn
    RESIDUAL_AT_1 = {"fused_add_rms_norm_static_fp8_quant"}  # (q, residual); others (q, scales..)
    DTYPES = [torch.float32, torch.float16, torch.bfloat16]

    def code_distance(a, b):
        """fp8 values apart; NaN and NaN 0 (any code: e4m3fnuz has one, at 0x80), NaN and a
        number 1000."""

        def ordinal(t):
            bits = t.contiguous().view(torch.uint8).to(torch.int32)
            mag = bits & 0x7F
            return torch.where(bits >= 128, -mag, mag)

        nan_a, nan_b = torch.isnan(a.float()), torch.isnan(b.float())
        d = torch.where(nan_a & nan_b, 0, (ordinal(a) - ordinal(b)).abs())
        return torch.where(nan_a != nan_b, 1000, d)

    def same_bits(a, b):
        """Equal, NaN where NaN (residual sums of rows holding infinities)."""
        return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
            a.nan_to_num(), b.nan_to_num()
        )

    def compare(op_name, got, want, dtype, where, counts, fp8=E4M3):
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if w is None:
                assert g is None, where
                continue
            assert (g.shape, g.dtype) == (w.shape, w.dtype) and g.is_contiguous(), where
            if g.dtype == fp8:
                d = code_distance(g, w)
                assert int(d.max()) <= 1, f"{where}: output {i} is {int(d.max())} codes off"
                counts[0] += int((d > 0).sum())
                counts[1] += d.numel()
            elif i == 1 and op_name not in RESIDUAL_AT_1:
                # scales: the same amax, divided correctly rounded (fp32 inputs: the norm's
                # last bit may differ, moving the amax by a float32 ulp)
                torch.testing.assert_close(g, w, atol=0, rtol=3e-7, msg=where)
            else:
                assert same_bits(g, w), f"{where}: output {i} differs"

    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("op_name", QUANT_OPS)
    def test_provider_matches_native(op_name, dtype):
        op = getattr(ops, op_name)
        counts = [0, 0]
        for s in op.sample_inputs("cpu", dtype):
            assert op.impls["triton"].supports_args(*s.args, **s.kwargs) is True, s.name
            with op.set_priority(["triton", "native"]):
                assert op.dispatch(*s.args, **s.kwargs).provider == "triton"
                got = op(*s.args, **s.kwargs)
            compare(op_name, got, op.native(*s.args, **s.kwargs), dtype, s.name, counts)
        _, fraction = fp8_tolerance(op_name, dtype)
        assert counts[1] and counts[0] <= fraction * counts[1], counts

    def test_fp8_rounding_matches_torch_everywhere():
        """Every fp8 value, every midpoint between neighbours (ties: to even), values a
        float32 ulp either side of each midpoint, random values over every binade and
        past the range, infinities and NaN: bit for bit torch's saturated conversion."""
        grid = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
        grid = grid[torch.isfinite(grid)].unique()
        mids = (grid[1:] + grid[:-1]) / 2
        near = torch.cat([torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)])
        g = torch.Generator().manual_seed(0)
        rand = torch.ldexp(torch.rand(20000, generator=g), torch.randint(-14, 12, (20000,)))
        x = torch.cat([grid, mids, near, rand, -rand, torch.tensor([1e30, float("inf")])])
        one = torch.ones(1)
        got = quant.scaled_fp8_quant(x[None, :], one)[0]
        want = x.clamp(-448, 448).to(E4M3)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        nan = quant.scaled_fp8_quant(torch.tensor([[float("nan"), 1.0]]), one)
        assert torch.isnan(nan.float()[0, 0]) and nan.float()[0, 1] == 1.0

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    def test_long_rows_take_the_chunked_path(dtype):
        """Rows longer than MAX_FUSED_COLS are read once per pass (squares, amax, codes)."""
        n = MAX_FUSED_COLS + 1000
        g = torch.Generator().manual_seed(1)
        x = torch.randn(3, n, generator=g).to(dtype)
        x[1] *= 50.0
        r = torch.randn(3, n, generator=g).to(dtype)
        w = (1 + torch.randn(n, generator=g) / 4).to(dtype)
        s, ub = torch.tensor([0.02]), torch.tensor([3.0])
        counts = [0, 0]
        for name, args in [
            ("rms_norm_dynamic_per_token_quant", (x, w, 1e-6, r, ub)),
            ("rms_norm_dynamic_per_token_quant", (x, None, 1e-6)),
            ("rms_norm_static_fp8_quant", (x, w, 1e-6, s)),
            ("fused_add_rms_norm_static_fp8_quant", (x, r, w, 1e-6, s)),
            ("dynamic_per_token_scaled_fp8_quant", (x,)),
        ]:
            op = getattr(ops, name)
            got = getattr(quant, name)(*args)
            compare(name, got, op.native(*args), dtype, name, counts)
        assert counts[0] <= 0.01 * counts[1], counts

    @pytest.mark.parametrize("op_name", QUANT_OPS)
    def test_a_platform_declaring_fnuz_gets_fnuz_codes(op_name, monkeypatch, request):
        """The kernels encode the codes themselves, so ``float8_e4m3fnuz`` (which Triton's
        interpreter cannot store as a type) runs here too: max 240, no negative zero."""
        monkeypatch.setattr(type(get_current_platform()), "fp8_dtype", torch.float8_e4m3fnuz)
        # A platform's declarations are fixed for a process, and dispatch keeps what it
        # bound under them: changing one in place is followed by invalidate_caches(), here
        # and again once the declaration is restored (docs/design.md#per-call-path).
        invalidate_caches()
        request.addfinalizer(invalidate_caches)
        op = getattr(ops, op_name)
        counts = [0, 0]
        for s in op.sample_inputs("cpu", torch.bfloat16):
            special = ("zero", "saturating", "tiny", "huge", "mixed", "nonfinite")
            if not any(k in s.name for k in special):
                continue
            with op.set_priority(["triton", "native"]):
                got = op(*s.args, **s.kwargs)
            want = op.native(*s.args, **s.kwargs)
            first = want[0] if isinstance(want, tuple) else want
            assert first.dtype == torch.float8_e4m3fnuz
            compare(op_name, got, want, torch.bfloat16, s.name, counts, fp8=torch.float8_e4m3fnuz)
        assert counts[1] and counts[0] <= 0.04 * counts[1], counts

    def nonfinite_rows():
        """Six rows of eight: row 0 finite, rows 1-4 the same values with NaN / +inf /
        -inf / all three in place of some (never the amax, 2.9), row 5 nothing finite."""
        nan, inf = float("nan"), float("inf")
        x = torch.tensor([[0.3, -1.7, 2.9, 0.05, -0.6, 1.1, -2.2, 0.8]] * 6)
        x[1, 3], x[2, 5], x[3, 0] = nan, inf, -inf
        x[4, 1], x[4, 4], x[4, 7] = nan, inf, -inf
        x[5] = torch.tensor([nan, inf, -inf] * 3)[:8]
        return x

    def _nonfinite_args(op_name, dtype):
        x = nonfinite_rows().to(dtype)
        r = torch.linspace(-1, 1, 48).reshape(6, 8).to(dtype)
        w = torch.linspace(0.5, 1.5, 8).to(dtype)
        s = torch.tensor([0.01])
        gated = torch.cat([x, x.flip(0)], dim=-1)
        return {
            "scaled_fp8_quant": [(x, s)],
            "dynamic_per_token_scaled_fp8_quant": [(x,), (x, torch.tensor([1.0]))],
            "per_token_group_quant_fp8": [(x, 4), (x, 4, True)],
            "rms_norm_static_fp8_quant": [(x, w, 1e-6, s)],
            "fused_add_rms_norm_static_fp8_quant": [(x, r, w, 1e-6, s)],
            "rms_norm_dynamic_per_token_quant": [(x, w, 1e-6), (x, w, 1e-6, r)],
            "silu_and_mul_fp8_quant": [(gated, s)],
            "silu_and_mul_per_token_group_fp8_quant": [(gated, 4)],
        }[op_name]

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    @pytest.mark.parametrize("op_name", QUANT_OPS)
    def test_nan_and_inf_rows_follow_the_rule(op_name, dtype):
        """The kernels follow native's rule on rows holding NaN and infinities: a dynamic
        scale from the finite elements (finite, the row's own scale without them), ±inf
        saturated to ±448, NaN kept; the same NaN positions and codes as native."""
        for args in _nonfinite_args(op_name, dtype):
            got = getattr(quant, op_name)(*args)
            want = getattr(ops, op_name).native(*args)
            compare(op_name, got, want, dtype, f"{op_name}{len(args)}", [0, 0])
            got = got if isinstance(got, tuple) else (got,)
            q = got[0].float()
            assert torch.isnan(q).any(), op_name
            if "norm" not in op_name:  # a normalised row holding inf is 0 and NaN: no inf
                assert (q.abs() == 448.0).any(), op_name
            if len(got) > 1 and op_name not in RESIDUAL_AT_1:
                assert torch.isfinite(got[1]).all(), f"{op_name}: scales {got[1]}"

    def test_a_nan_or_inf_leaves_the_row_scale_alone():
        """Rows 1-4 hold row 0's finite values and NaN / ±inf elsewhere: the same scale
        and, at the finite places, the same codes as row 0; row 5 (nothing finite) gets
        MIN_SCALE; ±inf -> ±448."""
        x = nonfinite_rows()
        q, scales = quant.dynamic_per_token_scaled_fp8_quant(x)
        assert torch.equal(scales[:5], scales[:1].expand(5, 1)), scales
        assert float(scales[5]) == quant.MIN_SCALE
        codes = q.float()
        for row in range(1, 5):
            finite = torch.isfinite(x[row])
            assert torch.equal(codes[row][finite], codes[0][finite]), row
        assert codes[2, 5] == 448.0 and codes[3, 0] == -448.0 and torch.isnan(codes[1, 3])

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
    def test_silu_and_mul_fp8_quant_rounds_once(dtype):
        """``silu(gate) * up`` is quantized from fp32, not rounded to ``x``'s dtype first:
        in fp16 at small magnitudes that rounding (fp16's subnormals) would move most of a
        row by a code or more from the exact value's e4m3 rounding."""
        g = torch.Generator().manual_seed(5)
        x = (torch.randn(8, 256, generator=g) * 1e-3).to(dtype)
        scale = torch.tensor([4.5e-6 / 448.0])
        xd = x.double()
        exact = (xd[:, :128] * torch.sigmoid(xd[:, :128]) * xd[:, 128:]) / scale.double()
        want = exact.clamp(-448, 448).to(E4M3)  # float64 -> e4m3: nearest, ties to even
        got = quant.silu_and_mul_fp8_quant(x, scale)
        d = code_distance(got, want)
        assert int(d.max()) <= 1 and float((d > 0).float().mean()) <= 0.01, int(d.max())
        native = ops.silu_and_mul_fp8_quant.native(x, scale)
        assert int(code_distance(got, native).max()) <= 1

    def test_supports_args_refuses_what_the_kernels_do_not_take():
        x, one = torch.randn(4, 64), torch.ones(1)
        sup = {n: getattr(ops, n).impls["triton"].supports_args for n in QUANT_OPS}
        assert sup["scaled_fp8_quant"](x.double(), one) is False  # fp64: native
        assert sup["scaled_fp8_quant"](x.t(), one) is False  # last dim not contiguous
        assert sup["per_token_group_quant_fp8"](x, 48) is False
        assert sup["silu_and_mul_per_token_group_fp8_quant"](x, 64) is False
        w = torch.ones(64)[::1]
        assert sup["rms_norm_static_fp8_quant"](x, torch.ones(128)[::2], 1e-6, one) is False
        assert sup["rms_norm_dynamic_per_token_quant"](x, w, 1e-6, x[:2]) is False
        assert sup["fused_add_rms_norm_static_fp8_quant"](x, x.half(), w, 1e-6, one) is False

    def test_many_rows_take_fewer_warps_and_match_native(monkeypatch):
        """With one multiprocessor, 9 rows are past the few-rows regime: the row kernels
        take `_launch.quant_row_params`' many-rows launch (one row, 32 elements a thread),
        and still agree with native."""
        from opcore.kernels.triton import _launch

        monkeypatch.setattr(_launch, "multiprocessors", lambda index=None: 1)
        assert _launch.quant_row_params(9, 1024, 1) == (1024, 1, True, 1)
        assert _launch.quant_row_params(9, 1024, 132) == (1024, 1, True, 4)  # few rows
        g = torch.Generator().manual_seed(4)
        x = torch.randn(9, 1024, generator=g).to(torch.bfloat16)
        r = torch.randn(9, 1024, generator=g).to(torch.bfloat16)
        w = (1 + torch.randn(1024, generator=g) / 4).to(torch.bfloat16)
        s = torch.tensor([0.02])
        for name, args in [
            ("rms_norm_static_fp8_quant", (x, w, 1e-6, s)),
            ("fused_add_rms_norm_static_fp8_quant", (x, r, w, 1e-6, s)),
            ("rms_norm_dynamic_per_token_quant", (x, w, 1e-6, r)),
            ("dynamic_per_token_scaled_fp8_quant", (x,)),
        ]:
            got = getattr(quant, name)(*args)
            compare(name, got, getattr(ops, name).native(*args), torch.bfloat16, name, [0, 0])

    def test_row_launch_changes_the_launch_not_the_result():
        """`quant.row_launch` (the bench's launch sweep) runs the row kernels with other
        rows per program and warps: codes at most one apart from the heuristic's launch
        (the sum of squares is ordered by the launch), scales and residual sums equal
        within float32 rounding; bad settings are refused by name."""
        g = torch.Generator().manual_seed(3)
        x = torch.randn(5, 256, generator=g).to(torch.bfloat16)  # 5 rows: a partial program
        r = torch.randn(5, 256, generator=g).to(torch.bfloat16)
        w = (1 + torch.randn(256, generator=g) / 4).to(torch.bfloat16)
        cases = [
            ("rms_norm_static_fp8_quant", (x, w, 1e-6, torch.tensor([0.02]))),
            ("rms_norm_dynamic_per_token_quant", (x, w, 1e-6, r)),
            ("dynamic_per_token_scaled_fp8_quant", (x,)),
        ]
        for name, args in cases:
            fn = getattr(quant, name)
            want = fn(*args)
            with quant.row_launch(4, 2):
                got = fn(*args)
            compare(name, got, want, torch.bfloat16, f"{name} rows=4 warps=2", [0, 0])
            want_native = getattr(ops, name).native(*args)
            compare(name, got, want_native, torch.bfloat16, f"{name} vs native", [0, 0])
        with pytest.raises(ValueError, match="num_warps must be a power of two"):
            with quant.row_launch(1, 3):
                pass
        with pytest.raises(ValueError, match="exceed one register tile"):
            with quant.row_launch(2, 4):
                quant.rms_norm_static_fp8_quant(
                    torch.randn(2, 16384), torch.ones(16384), 1e-6, torch.ones(1)
                )

    def test_static_launch_changes_the_tiles_not_the_codes():
        """`quant.static_launch` (the bench's output-tile sweep) runs the elementwise kernels
        on other tiles: an elementwise kernel's codes are the same bits under any tile,
        including tiles wider than the row, row blocks that end masked and tiles numbered
        columns first; bad settings are refused by name."""
        g = torch.Generator().manual_seed(4)
        x = torch.randn(5, 2 * 96, generator=g).to(torch.bfloat16)
        s = torch.tensor([0.02])
        for name, args in [("silu_and_mul_fp8_quant", (x, s)), ("scaled_fp8_quant", (x, s))]:
            fn = getattr(quant, name)
            want = fn(*args).view(torch.uint8)
            # The last two number the tiles columns first (a 1-D grid); 3 column tiles of
            # 32 and 2 row blocks make an order that a wrong row/column split would break.
            for tile in [(32, 4, 1), (256, 1, 2), (64, 2, 4), (32, 4, 1, True), (64, 2, 2, True)]:
                with quant.static_launch(*tile):
                    got = fn(*args).view(torch.uint8)
                assert torch.equal(got, want), (name, tile)
        for bad, what in [
            ((96, 1, 1), "block_c"),
            ((64, 3, 1), "rows"),
            ((64, 1, 64), "num_warps"),
        ]:
            with pytest.raises(ValueError, match=f"static_launch: {what} must be a power of two"):
                with quant.static_launch(*bad):
                    pass

    @pytest.mark.parametrize("forcing", ["static_launch", "row_launch"])
    def test_a_forced_launch_does_not_outlive_its_block_in_dispatch(forcing, monkeypatch):
        # A call through dispatch inside the block is bound (recorded, then replayed per
        # call); without dropping the routes on exit, the same signature went on replaying
        # the forced launch after the block, with no launch decided again.
        from opcore.kernels.triton import _bound

        grids = []
        real = _bound.launch

        def spy(kernel, grid, *args, **options):
            grids.append(tuple(grid))
            return real(kernel, grid, *args, **options)

        monkeypatch.setattr(_bound, "launch", spy)
        g = torch.Generator().manual_seed(6)
        if forcing == "static_launch":
            op, forced = ops.scaled_fp8_quant, quant.static_launch(32, 4, 1)
            args = (torch.randn(5, 192, generator=g).to(torch.bfloat16), torch.tensor([0.02]))
        else:
            op, forced = ops.rms_norm_static_fp8_quant, quant.row_launch(4, 1)
            x = torch.randn(5, 64, generator=g).to(torch.bfloat16)
            args = (x, torch.ones(64, dtype=torch.bfloat16), 1e-6, torch.tensor([0.02]))
        with op.set_priority(["triton", "native"]):
            with forced:
                op(*args)
                op(*args)  # bound by now: replayed
            inside = list(grids)
            grids.clear()
            op(*args)
        assert inside, "the forced call launched nothing"
        assert grids, "the call after the block replayed the forced launch"
        assert grids[0] != inside[0]  # decided again, by the launch model
