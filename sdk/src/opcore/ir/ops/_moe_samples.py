"""Sample inputs of the mixture-of-experts ops (`opcore.ir.ops._moe`).

Routing logits "without ties" are a per-row permutation of ``E`` distinct multiples of
1/32 in ``[-4, 4)``, exact in fp16, bf16 and fp32, so every dtype sees the same order and no
two experts tie; the ``ties_*`` samples draw integers from {-1, 0, 1} instead, so most
experts tie and the tie rule (lower id first) decides. ``fused_experts`` samples route each
token to ``k`` distinct experts drawn from a subset, so some experts are never chosen.
"""

from __future__ import annotations

import torch

from opcore.ir.samples import SampleInput, randn


def distinct_logits(tokens: int, experts: int, dtype, g) -> torch.Tensor:
    """``[tokens, experts]``: each row a permutation of ``experts`` distinct values."""
    step = 8.0 / max(experts, 32)
    perm = torch.rand(tokens, experts, generator=g).argsort(dim=-1).to(torch.float32)
    return ((perm - experts / 2) * step).to(dtype)


def tied_logits(tokens: int, experts: int, dtype, g) -> torch.Tensor:
    return torch.randint(-1, 2, (tokens, experts), generator=g).to(dtype)


# (tokens, experts, topk, renormalize)
_SOFTMAX_QUICK = [(1, 8, 2, True), (7, 64, 6, True), (5, 256, 8, False), (16, 128, 1, False)]
_SOFTMAX_FULL = [(3, 60, 4, True), (512, 128, 8, True), (2048, 256, 8, False), (8192, 8, 2, True)]


def softmax_samples(dtype, *, quick, generator):
    for t, e, k, renorm in _SOFTMAX_QUICK + ([] if quick else _SOFTMAX_FULL):
        name = f"t{t}_e{e}_k{k}" + ("_renorm" if renorm else "")
        yield SampleInput(name, (distinct_logits(t, e, dtype, generator), k, renorm))
    yield SampleInput("ties_t6_e16_k4", (tied_logits(6, 16, dtype, generator), 4, True))
    yield SampleInput("ties_t3_e8_k8", (tied_logits(3, 8, dtype, generator), 8, False))


# (tokens, experts, groups, topk_group, topk, scoring, renormalize, scale, bias)
_GROUPED_QUICK = [
    (5, 256, 8, 4, 8, "sigmoid", True, 2.5, True),  # DeepSeek-V3
    (4, 64, 8, 3, 6, "softmax", False, 1.0, False),
    (3, 16, 4, 2, 2, "sigmoid", False, 1.0, True),
    (2, 8, 1, 1, 2, "softmax", True, 1.0, False),
]
_GROUPED_FULL = [
    (512, 256, 8, 4, 8, "sigmoid", True, 2.5, True),
    (1024, 160, 8, 3, 6, "softmax", False, 16.0, False),  # DeepSeek-V2
    (4096, 64, 4, 2, 4, "sigmoid", True, 1.0, True),
]


def grouped_samples(dtype, *, quick, generator):
    for t, e, grp, tg, k, fn, renorm, scale, bias in _GROUPED_QUICK + (
        [] if quick else _GROUPED_FULL
    ):
        name = f"t{t}_e{e}_g{grp}_tg{tg}_k{k}_{fn}" + ("_bias" if bias else "")
        logits = distinct_logits(t, e, dtype, generator)
        b = randn((e,), torch.float32, generator, scale=0.1) if bias else None
        yield SampleInput(name, (logits, k, renorm, grp, tg, fn, scale, b))
    tied = tied_logits(6, 32, dtype, generator)
    yield SampleInput("ties_t6_e32_g4_tg2_k4_softmax", (tied, 4, True, 4, 2))
    tied = tied_logits(5, 32, dtype, generator)
    zero = torch.zeros(32, dtype=torch.float32)
    yield SampleInput(
        "ties_t5_e32_g8_tg3_k5_sigmoid_bias", (tied, 5, False, 8, 3, "sigmoid", 1.0, zero)
    )


# (tokens, experts, used experts, topk, hidden, intermediate, activation, on_input)
_EXPERTS_QUICK = [
    (1, 8, 8, 2, 64, 32, "silu", False),
    (7, 16, 8, 2, 48, 40, "silu", False),
    (5, 256, 24, 8, 32, 16, "silu", False),
    (9, 64, 40, 6, 72, 24, "gelu", False),
    (4, 8, 6, 1, 40, 24, "silu", True),
    (16, 32, 32, 8, 96, 56, "silu", False),
]
_EXPERTS_FULL = [
    (128, 128, 100, 8, 1024, 256, "silu", False),
    (64, 8, 8, 2, 4096, 1408, "silu", False),
    (200, 64, 64, 6, 1536, 320, "gelu", False),
    (8192, 16, 12, 2, 256, 128, "silu", False),
    (4, 8, 8, 2, 7168, 256, "silu", False),
    (33, 16, 16, 1, 1000, 200, "silu", True),
]


def _routing(tokens, experts, used, k, g):
    pool = torch.randperm(experts, generator=g)[:used]
    pick = torch.rand(tokens, used, generator=g).argsort(dim=-1)[:, :k]
    ids = pool[pick].to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, k, generator=g), dim=-1)
    return weights, ids


def experts_samples(dtype, *, quick, generator):
    for t, e, used, k, h, i, act, on_input in _EXPERTS_QUICK + ([] if quick else _EXPERTS_FULL):
        name = f"t{t}_e{e}_used{used}_k{k}_h{h}_i{i}_{act}" + ("_on_input" if on_input else "")
        x = randn((t, h), dtype, generator)
        w13 = randn((e, 2 * i, h), dtype, generator, scale=h**-0.5)
        w2 = randn((e, h, i), dtype, generator, scale=i**-0.5)
        weights, ids = _routing(t, e, used, k, generator)
        yield SampleInput(name, (x, w13, w2, weights, ids, act, on_input))
    # int64 ids, and hidden rows that are a strided view
    x = randn((6, 3 * 40), dtype, generator)[:, 40:80]
    w13 = randn((8, 48, 40), dtype, generator, scale=40**-0.5)
    w2 = randn((8, 40, 24), dtype, generator, scale=24**-0.5)
    weights, ids = _routing(6, 8, 5, 2, generator)
    yield SampleInput("strided_int64_t6_e8_k2_h40_i24", (x, w13, w2, weights, ids.long()))
