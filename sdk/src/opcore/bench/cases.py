"""Shape sets and argument builders for `opcore bench`.

A `Case` is one op at one shape: its positional arguments (built on the device) and the
fewest bytes the op must move (each input read once, each output written once), which is
what GB/s and % of copy bandwidth are computed from.

Shape sets: decode (1, 8, 32, 256 tokens) and prefill (4096, 32768 tokens), hidden 4096
and 8192. Activations use the Llama intermediate sizes (14336 for hidden 4096, 28672 for
8192). Rotary uses q/k slices of a Llama QKV buffer (32 q / 8 kv heads of 128 at hidden
4096; 64 / 8 at 8192); the fused split uses the same head layouts with Qwen3-style
per-head q/k norms. ``--quick`` shrinks everything for a CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from opcore.bench.shapes import (  # noqa: F401  (re-exported: the shape sets live there)
    DECODE_TOKENS,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    MAX_POSITION,
    OPS,
    PREFILL_TOKENS,
    QUICK_HIDDEN,
    QUICK_TOKENS,
)


@dataclasses.dataclass
class Case:
    op: str
    tokens: int
    hidden: int
    layout: str
    dtype: torch.dtype
    args: tuple[Any, ...]
    nbytes: int
    # Extra tensors some baselines need, prepared outside the timed region.
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.op}/{self.layout}/T={self.tokens}"


def _cos_sin_cache(rot: int, device) -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot))
    f = torch.arange(MAX_POSITION, dtype=torch.float32, device=device)[:, None] * inv[None, :]
    return torch.cat([f.cos(), f.sin()], dim=-1)


def _quick_dims(hidden: int, quick: bool) -> tuple[int, int, int, int]:
    if quick:
        return 2 * hidden, 4, 2, 64
    return (INTERMEDIATE.get(hidden, 4 * hidden), *HEADS.get(hidden, (hidden // 128, 8, 128)))


def build(
    op: str, tokens: int, hidden: int, dtype: torch.dtype, device, *, quick: bool = False
) -> Case:
    """The case for ``op`` at ``tokens`` x ``hidden`` (random data; never zeros)."""
    es = torch.empty((), dtype=dtype).element_size()
    inter, hq, hkv, d = _quick_dims(hidden, quick)
    seed = tokens * 31 + hidden
    g = torch.Generator(device="cpu").manual_seed(seed)
    # The data is drawn where it is used: on the host, a 32k-token activation input (two
    # billion values) would take seconds to draw and gigabytes to stage.
    dev = torch.device(device)
    gd = g
    if dev.type != "cpu":
        try:
            gd = torch.Generator(device=dev).manual_seed(seed)
        except (RuntimeError, TypeError):  # a device without generators: draw on the host
            gd = g

    def randn(*shape):
        where = dev if gd is not g else "cpu"
        x = torch.randn(*shape, generator=gd, dtype=torch.float32, device=where)
        return x.to(device=dev, dtype=dtype)

    if op in ("rms_norm", "fused_add_rms_norm"):
        x, w = randn(tokens, hidden), randn(hidden)
        layout = f"H={hidden}"
        if op == "rms_norm":
            return Case(
                op, tokens, hidden, layout, dtype, (x, w, 1e-6), (2 * tokens + 1) * hidden * es
            )
        r = randn(tokens, hidden)
        return Case(
            op, tokens, hidden, layout, dtype, (x, r, w, 1e-6), (4 * tokens + 1) * hidden * es
        )
    if op in ("silu_and_mul", "gelu_and_mul"):
        x = randn(tokens, 2 * inter)
        args = (x,) if op == "silu_and_mul" else (x, "tanh")
        extras = {"gate": x[:, :inter].contiguous(), "up": x[:, inter:].contiguous()}
        return Case(op, tokens, hidden, f"I={inter}", dtype, args, 3 * tokens * inter * es, extras)
    positions = torch.randint(0, MAX_POSITION, (tokens,), generator=g).to(device)
    cache = _cos_sin_cache(d, device)
    qkv = randn(tokens, (hq + 2 * hkv) * d)
    layout = f"{hq}/{hkv}x{d}"
    cache_bytes = tokens * (d * 4 + 8)  # fp32 cos/sin row + int64 position per token
    if op == "rotary_embedding":
        q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hkv) * d]
        rows = cache[positions]
        cos = torch.cat([rows[:, : d // 2]] * 2, -1)[None]
        sin = torch.cat([rows[:, d // 2 :]] * 2, -1)[None]
        extras = {
            "q4": q.reshape(tokens, hq, d).transpose(0, 1)[None].contiguous(),
            "k4": k.reshape(tokens, hkv, d).transpose(0, 1)[None].contiguous(),
            "cos": cos.contiguous(),
            "sin": sin.contiguous(),
        }
        nbytes = 2 * tokens * (hq + hkv) * d * es + cache_bytes
        return Case(
            op,
            tokens,
            hidden,
            f"llama {layout}",
            dtype,
            (positions, q, k, d, cache, True),
            nbytes,
            extras,
        )
    if op == "split_qkv_rmsnorm_rope":
        qw, kw = randn(d), randn(d)
        nbytes = 2 * tokens * (hq + 2 * hkv) * d * es + cache_bytes
        return Case(
            op,
            tokens,
            hidden,
            f"qwen3 {layout}",
            dtype,
            (qkv, qw, kw, 1e-6, positions, cache, hq, hkv, d, True),
            nbytes,
            {"heads": (hq, hkv, d)},
        )
    raise ValueError(f"opcore bench: unknown op {op!r}; known: {', '.join(OPS)}")


CaseBuilder = Callable[..., Case]
