"""``split_qkv_rmsnorm_rope``: split a fused QKV projection, RMS-normalize q and k per
head, apply rotary embedding to them, copy v.

``qkv`` is ``[*positions.shape, (num_heads + 2 * num_kv_heads) * head_size]`` (rows may be
strided). Each q (k) head is normalized over its ``head_size`` features with
``q_weight`` (``k_weight``) of shape ``[head_size]`` (``None``: no scale), then rotated as
in ``rotary_embedding``. The fused op keeps fp32 between the norm and the rotation and
casts once. Returns new ``q [*, num_heads * head_size]``, ``k`` and ``v
[*, num_kv_heads * head_size]``.
"""

from __future__ import annotations

import torch

from opcore.ir.op import register_op
from opcore.ir.ops import _checks as c
from opcore.ir.rope import apply_rope, build_cos_sin_cache
from opcore.ir.samples import SampleInput, randn

OP = "split_qkv_rmsnorm_rope"


@register_op(tolerances={torch.float16: (1e-2, 2e-3), torch.bfloat16: (2e-2, 1.6e-2)})
def split_qkv_rmsnorm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    epsilon: float,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split, per-head RMSNorm of q and k, rotary of q and k; see module docstring."""
    acc = torch.float64 if qkv.dtype == torch.float64 else torch.float32
    lead = tuple(qkv.shape[:-1])
    n = positions.numel()
    qh, kh = num_heads * head_size, num_kv_heads * head_size
    flat = qkv.reshape(n, qkv.shape[-1])
    cs = cos_sin_cache.index_select(0, positions.reshape(-1)).to(acc)
    half = cs.shape[-1] // 2
    cos, sin = cs[:, None, :half], cs[:, None, half:]

    def norm_rope(part: torch.Tensor, heads: int, weight: torch.Tensor | None) -> torch.Tensor:
        t = part.to(acc).reshape(n, heads, head_size)
        t = t * torch.rsqrt(t.pow(2).mean(dim=-1, keepdim=True) + epsilon)
        if weight is not None:
            t = t * weight.to(acc)
        return apply_rope(t, cos, sin, is_neox).to(qkv.dtype).reshape(*lead, heads * head_size)

    q = norm_rope(flat[:, :qh], num_heads, q_weight)
    k = norm_rope(flat[:, qh : qh + kh], num_kv_heads, k_weight)
    v = qkv[..., qh + kh :].clone(memory_format=torch.contiguous_format)
    return q, k, v


@split_qkv_rmsnorm_rope.register_validator
def _validate(
    qkv,
    q_weight,
    k_weight,
    epsilon,
    positions,
    cos_sin_cache,
    num_heads,
    num_kv_heads,
    head_size,
    is_neox,
):
    # Each rule one condition; a failing one raises via a `_checks` helper (see there).
    try:
        dt, dev = qkv.dtype, qkv.device
        if dt not in c.FLOAT_SET or qkv.ndim < 2:
            c.bad_float(OP, "qkv", qkv, min_dim=2)
        if not c.eps_ok(epsilon):
            c.bad_eps(OP, "epsilon", epsilon)
        for arg, value in (
            ("num_heads", num_heads),
            ("num_kv_heads", num_kv_heads),
            ("head_size", head_size),
        ):
            if not c.positive_int_ok(value):
                c.bad_positive_int(OP, arg, value)
        expected = (num_heads + 2 * num_kv_heads) * head_size
        if qkv.shape[-1] != expected:
            c.fail(
                OP,
                "qkv",
                f"last dim is {qkv.shape[-1]}, but (num_heads + 2 * num_kv_heads) * head_size = "
                f"({num_heads} + 2 * {num_kv_heads}) * {head_size} = {expected}",
            )
        if q_weight is not None and not c.weight_ok(q_weight, head_size, dt, dev):
            c.bad_weight(OP, "q_weight", q_weight, head_size, "qkv", qkv)
        if k_weight is not None and not c.weight_ok(k_weight, head_size, dt, dev):
            c.bad_weight(OP, "k_weight", k_weight, head_size, "qkv", qkv)
        if not c.cache_ok(cos_sin_cache, head_size, dt, dev):
            c.bad_cache(OP, cos_sin_cache, head_size, "qkv", qkv)
        if not c.positions_ok(positions, dev):
            c.bad_positions(OP, positions, "qkv", qkv)
        c.check_position_values(OP, positions, cos_sin_cache)
        if qkv.shape[:-1] != positions.shape:
            c.fail(
                OP,
                "qkv",
                f"has shape {tuple(qkv.shape)}; expected [*positions.shape, hidden] with "
                f"positions.shape {tuple(positions.shape)}",
            )
    except AttributeError:
        c.not_tensors(
            OP,
            qkv=qkv,
            q_weight=q_weight,
            k_weight=k_weight,
            positions=positions,
            cos_sin_cache=cos_sin_cache,
        )
        raise
    if type(is_neox) is not bool:
        c.bad_bool(OP, "is_neox", is_neox)


@split_qkv_rmsnorm_rope.register_fake
def _fake(
    qkv,
    q_weight,
    k_weight,
    epsilon,
    positions,
    cos_sin_cache,
    num_heads,
    num_kv_heads,
    head_size,
    is_neox,
):
    lead = tuple(qkv.shape[:-1])
    kv = num_kv_heads * head_size
    return (
        qkv.new_empty((*lead, num_heads * head_size)),
        qkv.new_empty((*lead, kv)),
        qkv.new_empty((*lead, kv)),
    )


# (name, tokens, heads, kv_heads, head_size, rot_dim, options)
_CASES = [
    ("t1_h2_kv1_d64", 1, 2, 1, 64, 64, {}),
    ("t5_h4_kv2_d64", 5, 4, 2, 64, 64, {}),
    ("t7_h3_kv1_d128", 7, 3, 1, 128, 128, {}),
    ("t13_h2_kv2_d80", 13, 2, 2, 80, 80, {}),
    ("partial_t5_h4_kv2_d64_r32", 5, 4, 2, 64, 32, {}),
    ("weights_none_t3_h2_kv1_d64", 3, 2, 1, 64, 64, {"weights": False}),
    ("batch_2x3_h2_kv1_d64", 6, 2, 1, 64, 64, {"batch": (2, 3)}),
    ("strided_rows_t6_h4_kv2_d64", 6, 4, 2, 64, 64, {"strided": True}),
    ("zero_rows_t4_h2_kv1_d64", 4, 2, 1, 64, 64, {"zero_rows": True}),
    ("large_magnitude_t4_h2_kv1_d64", 4, 2, 1, 64, 64, {"scale": 300.0}),
]
_FULL_CASES = [
    ("t128_h32_kv8_d128", 128, 32, 8, 128, 128, {}),
    ("t33_h16_kv4_d128_r64", 33, 16, 4, 128, 64, {"strided": True}),
]
MAX_POSITION = 4096


@split_qkv_rmsnorm_rope.register_sample_inputs
def _samples(dtype, *, quick, generator):
    for name, tokens, heads, kv_heads, head_size, rot_dim, opts in (
        _CASES if quick else _CASES + _FULL_CASES
    ):
        lead = opts.get("batch") or (tokens,)
        hidden = (heads + 2 * kv_heads) * head_size
        scale = opts.get("scale", 1.0)
        if opts.get("strided"):
            qkv = randn((*lead, hidden + 48), dtype, generator, scale=scale)[..., 16 : 16 + hidden]
        else:
            qkv = randn((*lead, hidden), dtype, generator, scale=scale)
        if opts.get("zero_rows"):
            qkv[1] = 0
        pos = torch.randperm(MAX_POSITION, generator=generator)[:tokens].reshape(lead)
        if opts.get("weights", True):
            # distinct q and k weights, so swapping them is caught
            qw = (1.0 + 0.5 * randn((head_size,), torch.float32, generator)).to(dtype)
            kw = (1.0 - 0.5 * randn((head_size,), torch.float32, generator)).to(dtype)
        else:
            qw = kw = None
        cache = build_cos_sin_cache(rot_dim, MAX_POSITION, 10000.0)
        for is_neox in (True, False):
            style = "neox" if is_neox else "gptj"
            yield SampleInput(
                f"{name}_{style}",
                (qkv, qw, kw, 1e-6, pos, cache, heads, kv_heads, head_size, is_neox),
            )
