"""Sample inputs of the fp8 quantization ops (`opcore.ir.ops._quant`): the activations,
scales and shapes their ``register_sample_inputs`` functions draw from.

Every dtype sees the same values: rows are drawn and shaped in fp32, then cast.
"""

from __future__ import annotations

import math

import torch

from opcore.ir.quant import DEFAULT_FP8_DTYPE
from opcore.ir.samples import randn

# Magnitudes: |x| of about 3 (randn's tail) maps to the top of the fp8 range under the
# default scale; "saturating" rows exceed it eightfold; "tiny" rows land among the fp8
# subnormals and zero under a static scale (and use the full range under a dynamic one);
# "huge" rows are near fp16's range.
DEFAULT_SCALE = 3.0 / 448.0
TINY, HUGE = 1e-5, 1e4
# "tiny_gated" rows (x 1e-3): |silu(gate) * up| up to about 4.5e-6 maps to fp8_max
TINY_GATED_SCALE = 4.5e-6 / 448.0


def scale(value: float = DEFAULT_SCALE, *, zero_dim: bool = False) -> torch.Tensor:
    t = torch.tensor([value], dtype=torch.float32)
    return t.reshape(()) if zero_dim else t


def rows(shape, dtype, g, kind: str = "", strided: bool = False) -> torch.Tensor:
    """An activation of ``shape`` (drawn and shaped in fp32, then cast, so every dtype sees
    the same values); ``kind`` makes some rows special: ``zero`` (every other row 0),
    ``large`` (all rows x100), ``mixed`` (row ``i`` scaled by ``10 ** (i % 7 - 3)``: tiny to
    large rows in one tensor; ``mixed_gated``: ``10 ** ((i % 7 - 3) / 3)``), ``tiny`` or
    ``huge`` (all rows), ``small`` (all rows x0.05), ``saturating`` (every other row 8x
    the scale's range), ``tiny_gated`` (all rows x1e-3: ``silu(gate) * up`` among fp16's
    subnormals, for the op that does not round it to ``x``'s dtype).

    Gated inputs use ``large``, ``small`` and ``mixed_gated`` instead of ``huge``, ``tiny``
    and ``mixed``: the op rounds ``silu(gate) * up`` to ``x``'s dtype, and a product of
    two tiny (huge) values underflows (overflows) fp16, where the float64 reference keeps
    it: such a row would measure fp16's range, not a kernel."""
    width = 3 * shape[-1] if strided else shape[-1]  # strided: rows of a 3x wider buffer
    buf = randn((*shape[:-1], width), torch.float32, g)
    x = buf[..., shape[-1] : 2 * shape[-1]] if strided else buf
    rows = x.reshape(-1, shape[-1])  # a view for 2-D shapes, which is where "mixed" is used
    if kind == "zero":
        x[..., ::2, :] = 0
    elif kind == "tiny":
        x.mul_(TINY)
    elif kind == "huge":
        x.mul_(HUGE)
    elif kind == "large":  # gated inputs: gate x up stays inside fp16's range
        x.mul_(100.0)
    elif kind == "small":  # gated inputs: gate x up stays above fp16's subnormals
        x.mul_(0.05)
    elif kind == "tiny_gated":  # gate x up (about 3e-7) among fp16's subnormals
        x.mul_(1e-3)
    elif kind == "saturating":
        x[..., ::2, :] *= 8.0
    elif kind.startswith("mixed"):
        # gated inputs multiply two such values: half the exponent keeps fp16 finite
        half = kind == "mixed_gated"
        for i in range(rows.shape[0]):
            rows[i] *= 10.0 ** ((i % 7 - 3) / (3 if half else 1))
    buf = buf.to(dtype)
    return buf[..., shape[-1] : 2 * shape[-1]] if strided else buf


def ties(shape, g) -> torch.Tensor:
    """Values that are exact rounding ties once divided by 0.0625: midpoints between
    neighbouring float8_e4m3fn values (below 448), times 0.0625. Midpoints have four
    mantissa bits, so every float dtype holds them exactly: a provider must round each to
    the neighbour with the even code."""
    grid = torch.arange(0, 126, dtype=torch.int32).to(torch.uint8).view(DEFAULT_FP8_DTYPE)
    grid = grid.to(torch.float32)  # 0 .. 416, every non-negative value below the max
    mids = (grid[:-1] + grid[1:]) / 2
    pick = torch.randint(0, mids.numel(), shape, generator=g)
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    return mids[pick] * sign * 0.0625


def nonfinite_rows(shape, dtype, g, *, gated: bool = False) -> torch.Tensor:
    """Six rows of ``randn`` with NaN and infinities at drawn columns (the rule of the module
    docstring): row 0 finite; 1 one NaN; 2 one +inf; 3 one -inf; 4 one each of NaN, +inf
    and -inf; 5 nothing finite (NaN, +inf, -inf in turn). ``gated`` (last dim ``2 * d``):
    rows 1-3 hold theirs in the gate half, row 4 in the up half (``silu(g) * inf``), so
    each of ``silu(nan)``, ``silu(±inf)`` and a non-finite ``up`` is there."""
    rows, width = shape
    x = randn(shape, torch.float32, g)
    half = width // 2 if gated else width
    specials = (math.nan, math.inf, -math.inf)
    cols = torch.randint(0, half, (6,), generator=g).tolist()
    for row, value in zip((1, 2, 3), specials, strict=True):
        x[row, cols[row]] = value
    up = half if gated else 0
    picked = torch.randperm(half, generator=g)[:3].tolist()
    for col, value in zip(picked, specials, strict=True):
        x[4, up + col] = value
    x[5] = torch.tensor(specials).repeat(width // 3 + 1)[:width]
    assert rows == 6, shape
    return x.to(dtype)


def plain_shapes(quick: bool):
    """(name, shape, kind, strided) shared by the plain and norm quantizers."""
    yield "t1_h8", (1, 8), "", False
    yield "t1_h4096", (1, 4096), "", False
    for h in (7, 32, 33, 128, 129) if quick else (1, 7, 16, 31, 32, 33, 64, 127, 128, 129, 1031):
        yield f"t5_h{h}", (5, h), "", False
    yield "3d_2x3x64", (2, 3, 64), "", False
    yield "strided_rows_t6_h96", (6, 96), "", True
    yield "zero_rows_t4_h32", (4, 32), "zero", False
    yield "saturating_rows_t4_h64", (4, 64), "saturating", False
    yield "tiny_t4_h64", (4, 64), "tiny", False
    yield "huge_t4_h64", (4, 64), "huge", False
    yield "mixed_rows_t14_h128", (14, 128), "mixed", False
    if not quick:
        yield "t256_h4096", (256, 4096), "", False
        yield "t33_h5120", (33, 5120), "", False


def group_shapes(quick: bool):
    """(name, shape, group_size, kind, strided)."""
    yield "t1_h128_g128", (1, 128), 128, "", False
    yield "t5_h256_g128", (5, 256), 128, "", False
    yield "t3_h96_g32", (3, 96), 32, "", False
    yield "t4_h64_g16", (4, 64), 16, "", False
    yield "3d_2x3x256_g64", (2, 3, 256), 64, "", False
    yield "strided_rows_t6_h256_g128", (6, 256), 128, "", True
    yield "zero_rows_t4_h256_g128", (4, 256), 128, "zero", False
    yield "tiny_t4_h128_g64", (4, 128), 64, "tiny", False
    yield "huge_t4_h128_g64", (4, 128), 64, "huge", False
    yield "mixed_rows_t14_h256_g128", (14, 256), 128, "mixed", False
    if not quick:
        yield "t256_h4096_g128", (256, 4096), 128, "", False
        yield "t7_h7168_g128", (7, 7168), 128, "", False


def norm_weight(n, dtype, g, with_weight: bool = True):
    if not with_weight:
        return None
    return (1.0 + 0.5 * randn((n,), torch.float32, g)).to(dtype)


def norm_shapes(quick: bool):
    for name, shape, kind, strided in plain_shapes(quick):
        yield name, shape, kind, strided, True
    yield "weight_none_t4_h48", (4, 48), "", False, False


# After RMSNorm every row has RMS 1 (times the weight), so a row's magnitude only matters
# through epsilon: "tiny" rows are dominated by it (their outputs are tiny), "huge" rows
# not at all. Saturation comes from the scale: 1/448 puts |y| > 1 past fp8_max.
NORM_SATURATING_SCALE = 1.0 / 448.0


def norm_scale(kind: str) -> torch.Tensor:
    return scale(NORM_SATURATING_SCALE if kind == "saturating" else DEFAULT_SCALE)


def gated_shapes(quick: bool):
    """(name, shape, kind, strided): the last dim is 2 * d."""
    yield "t1_d8", (1, 16), "", False
    for d in (7, 32, 33, 128, 129) if quick else (1, 7, 16, 31, 32, 33, 64, 127, 128, 129, 1031):
        yield f"t5_d{d}", (5, 2 * d), "", False
    yield "3d_2x3x64", (2, 3, 128), "", False
    yield "strided_rows_t6_d48", (6, 96), "", True
    yield "zero_rows_t4_d32", (4, 64), "zero", False
    yield "saturating_rows_t4_d32", (4, 64), "saturating", False
    yield "small_t4_d64", (4, 128), "small", False
    yield "large_t4_d64", (4, 128), "large", False
    yield "mixed_rows_t14_d128", (14, 256), "mixed_gated", False
    if not quick:
        yield "t256_d11008", (256, 2 * 11008), "", False
        yield "t1_d14336", (1, 2 * 14336), "", False
