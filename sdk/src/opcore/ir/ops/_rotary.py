"""``rotary_embedding``: rotary position embedding of query (and key) heads.

Row ``positions[t]`` of ``cos_sin_cache`` (``[max_position, rot_dim]``: cos half, sin half)
rotates the first ``rot_dim`` features of every head of token ``t``: NeoX style
(``is_neox=True``, rotate halves) or GPT-J style (interleaved pairs). ``rot_dim <
head_size`` is partial rotary: the rest passes through. ``query``/``key`` are
``[*positions.shape, heads * head_size]`` or ``[*positions.shape, heads, head_size]``;
``key`` may be ``None``. Returns new ``(query, key)`` tensors; fp32 math, cast back.
"""

from __future__ import annotations

import torch

from opcore.ir.op import register_op
from opcore.ir.ops import _checks as c
from opcore.ir.rope import apply_rope, build_cos_sin_cache
from opcore.ir.samples import SampleInput, randn

OP = "rotary_embedding"


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rope_tokens(
    t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, is_neox: bool
) -> torch.Tensor:
    """Rotate ``t`` (``[*lead, ...]`` with ``cos``/``sin`` ``[N, rot_dim//2]``, ``N`` tokens)."""
    n = cos.shape[0]
    if n == 0:  # no tokens: reshape(0, -1, head_size) is ambiguous; the result is empty like t
        return torch.empty_like(t, memory_format=torch.contiguous_format)
    tf = t.reshape(n, -1, head_size).to(cos.dtype)
    out = apply_rope(tf, cos[:, None, :], sin[:, None, :], is_neox)
    return out.to(t.dtype).reshape(t.shape)


@register_op(allow_inplace=True, activations=["query", "key"])
def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotary embedding (see module docstring); returns ``(query, key)``."""
    acc = _acc(query.dtype)
    cs = cos_sin_cache.index_select(0, positions.reshape(-1)).to(acc)
    half = cs.shape[-1] // 2
    cos, sin = cs[:, :half], cs[:, half:]
    q = rope_tokens(query, cos, sin, head_size, is_neox)
    k = None if key is None else rope_tokens(key, cos, sin, head_size, is_neox)
    return q, k


@rotary_embedding.register_validator
def _validate(positions, query, key, head_size, cos_sin_cache, is_neox):
    # Each rule one condition; a failing one raises via a `_checks` helper (see there).
    try:
        dt, dev = query.dtype, query.device
        if dt not in c.FLOAT_SET or query.ndim < 2:
            c.bad_float(OP, "query", query, min_dim=2)
        if not c.positive_int_ok(head_size):
            c.bad_positive_int(OP, "head_size", head_size)
        if not c.cache_ok(cos_sin_cache, head_size, dt, dev):
            c.bad_cache(OP, cos_sin_cache, head_size, "query", query)
        if not c.positions_ok(positions, dev):
            c.bad_positions(OP, positions, "query", query)
        c.check_position_values(OP, positions, cos_sin_cache)
        lead = positions.shape
        if not c.heads_ok(query, lead, head_size):
            c.bad_heads(OP, "query", query, positions, head_size, "query", query)
        if key is not None and not (
            key.dtype is dt and key.device == dev and c.heads_ok(key, lead, head_size)
        ):
            c.bad_heads(OP, "key", key, positions, head_size, "query", query)
    except AttributeError:
        c.not_tensors(OP, positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
        raise
    if type(is_neox) is not bool:
        c.bad_bool(OP, "is_neox", is_neox)


@rotary_embedding.register_fake
def _fake(positions, query, key, head_size, cos_sin_cache, is_neox):
    return query.new_empty(query.shape), None if key is None else key.new_empty(key.shape)


# --------------------------------------------------------------------------- samples
# (name, tokens, heads, kv_heads, head_size, rot_dim, options)
_CASES = [
    ("t1_h1_d64", 1, 1, 1, 64, 64, {}),
    ("t5_h4_kv2_d64", 5, 4, 2, 64, 64, {}),
    ("t7_h3_kv1_d128", 7, 3, 1, 128, 128, {}),
    ("t13_h2_kv2_d80", 13, 2, 2, 80, 80, {}),
    ("partial_t5_h4_kv2_d64_r32", 5, 4, 2, 64, 32, {}),
    ("partial_t3_h2_kv1_d80_r24", 3, 2, 1, 80, 24, {}),
    ("key_none_t5_h4_d64", 5, 4, 0, 64, 64, {}),
    ("heads_dim_t5_h4_kv2_d32", 5, 4, 2, 32, 32, {"split_heads": True}),
    ("batch_2x3_h2_kv1_d64", 6, 2, 1, 64, 64, {"batch": (2, 3)}),
    ("batch_4d_2x3_h2_kv1_d64", 6, 2, 1, 64, 32, {"batch": (2, 3), "split_heads": True}),
    ("strided_qkv_t6_h4_kv2_d64", 6, 4, 2, 64, 64, {"strided": True}),
    ("strided_qkv_t1_h2_kv1_d128_r64", 1, 2, 1, 128, 64, {"strided": True}),
    ("cache_in_input_dtype_t4_h2_kv2_d64", 4, 2, 2, 64, 64, {"cache_dtype": "input"}),
    ("large_magnitude_t4_h2_kv1_d64", 4, 2, 1, 64, 64, {"scale": 300.0}),
    ("int32_positions_t4_h2_kv1_d64", 4, 2, 1, 64, 64, {"int32": True}),
    # a decode step: one position broadcast over a batch of 4 (a stride-0 view)
    (
        "expanded_positions_4x1_h2_kv1_d64",
        4,
        2,
        1,
        64,
        64,
        {"batch": (4, 1), "expand_positions": True},
    ),
]
_FULL_CASES = [
    ("t128_h32_kv8_d128", 128, 32, 8, 128, 128, {}),
    ("t33_h28_kv4_d128_r64", 33, 28, 4, 128, 64, {"strided": True}),
    ("t17_h8_kv8_d256", 17, 8, 8, 256, 256, {}),
]
MAX_POSITION = 4096


def _case_tensors(dtype, generator, tokens, heads, kv_heads, head_size, rot_dim, opts):
    """positions, q, k (or None), cache for one case."""
    batch = opts.get("batch")
    lead = batch if batch else (tokens,)
    pos = torch.randperm(MAX_POSITION, generator=generator)[:tokens].reshape(lead)
    if tokens > 1:
        pos.view(-1)[-1] = MAX_POSITION - 1  # the last row of the cache is reachable
    if opts.get("expand_positions"):
        pos = pos.reshape(-1)[:1].reshape((1,) * len(lead)).expand(lead)
    if opts.get("int32"):
        pos = pos.to(torch.int32)
    scale = opts.get("scale", 1.0)
    qh, kh = heads * head_size, kv_heads * head_size
    if opts.get("strided"):
        buf = randn((*lead, qh + 2 * kh), dtype, generator, scale=scale)
        q, k = buf[..., :qh], buf[..., qh : qh + kh]
    else:
        q = randn((*lead, qh), dtype, generator, scale=scale)
        k = randn((*lead, kh), dtype, generator, scale=scale) if kv_heads else None
    if opts.get("split_heads"):
        q = q.unflatten(-1, (heads, head_size))
        k = None if k is None else k.unflatten(-1, (kv_heads, head_size))
    cache = build_cos_sin_cache(rot_dim, MAX_POSITION, 10000.0)
    if opts.get("cache_dtype") == "input":
        cache = cache.to(dtype)
    return pos, q, k, cache


def cases(quick: bool):
    return _CASES if quick else _CASES + _FULL_CASES


@rotary_embedding.register_sample_inputs
def _samples(dtype, *, quick, generator):
    for name, tokens, heads, kv_heads, head_size, rot_dim, opts in cases(quick):
        pos, q, k, cache = _case_tensors(
            dtype, generator, tokens, heads, kv_heads, head_size, rot_dim, opts
        )
        for is_neox in (True, False):
            style = "neox" if is_neox else "gptj"
            yield SampleInput(f"{name}_{style}", (pos, q, k, head_size, cache, is_neox))
