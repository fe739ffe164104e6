"""A small Llama-shaped decoder written with `opcore.ir` ops, for tests, conformance checks
and ``bench/compile_decoder.py``.

Each layer is written the way a model author writes it, unfused: ``residual = h + residual``
then ``rms_norm``; QKV projection, split, per-head ``rms_norm`` of q and k (QK-norm, as in
Qwen3), ``rotary_embedding``; attention (``scaled_dot_product_attention``, GQA); o-proj;
SiLU-gated MLP with ``silu_and_mul``. The fusion passes turn the add + norm pairs into
``fused_add_rms_norm`` and the split + norms + rotary into ``split_qkv_rmsnorm_rope``.

``impl="opcore"`` calls the ops (one opaque node each under torch.compile); ``impl="native"``
calls their native functions directly, so plain ``torch.compile`` sees only aten ops.

Tokens are flattened (``[T, hidden]``, positions ``[T]``). ``forward(positions, hidden)``
in prefill attends causally over the T tokens of one sequence; with ``decode_context=C``
each token is its own sequence attending to C cached keys/values plus itself.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from opcore.ir import ops
from opcore.ir.rope import build_cos_sin_cache


@dataclasses.dataclass
class DecoderShape:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_size: int = 16
    intermediate: int = 128
    max_position: int = 512
    eps: float = 1e-6

    @classmethod
    def llama_8b_like(cls, layers: int = 8) -> DecoderShape:
        """Llama-3-8B's layer shapes (hidden 4096, 32 heads, 8 KV heads, head 128, MLP 14336)."""
        return cls(layers, 4096, 32, 8, 128, 14336, 8192, 1e-5)


class _Calls:
    """The op calls of one implementation style."""

    def __init__(self, impl: str):
        if impl not in ("opcore", "native"):
            raise ValueError(f"decoder impl must be 'opcore' or 'native', got {impl!r}")
        pick = (lambda op: op) if impl == "opcore" else (lambda op: op.native)
        self.rms_norm = pick(ops.rms_norm)
        self.rotary_embedding = pick(ops.rotary_embedding)
        self.silu_and_mul = pick(ops.silu_and_mul)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        s: DecoderShape,
        calls: _Calls,
        decode_context: int | None,
        generator: torch.Generator,
        dtype: torch.dtype,
    ):
        super().__init__()
        self.s, self.calls, self.decode_context = s, calls, decode_context
        device = generator.device

        def randn(*shape):
            return torch.randn(*shape, generator=generator, device=device)

        def p(*shape, scale=None):
            scale = scale if scale is not None else shape[-1] ** -0.5
            return nn.Parameter((randn(*shape) * scale).to(dtype), requires_grad=False)

        self.input_norm = p(s.hidden, scale=0.1)
        self.post_attn_norm = p(s.hidden, scale=0.1)
        with torch.no_grad():
            self.input_norm += 1.0
            self.post_attn_norm += 1.0
        self.q_norm = nn.Parameter((1.0 + 0.1 * randn(s.head_size)).to(dtype), requires_grad=False)
        self.k_norm = nn.Parameter((1.0 + 0.1 * randn(s.head_size)).to(dtype), requires_grad=False)
        self.qkv = p((s.heads + 2 * s.kv_heads) * s.head_size, s.hidden)
        self.o = p(s.hidden, s.heads * s.head_size)
        self.gate_up = p(2 * s.intermediate, s.hidden)
        self.down = p(s.hidden, s.intermediate)
        if decode_context:
            kv = randn(2, s.kv_heads, decode_context, s.head_size).to(dtype)
            self.register_buffer("kv_cache", kv, persistent=False)

    def attention(self, positions, h, cos_sin_cache):
        s, c = self.s, self.calls
        qh, kh = s.heads * s.head_size, s.kv_heads * s.head_size
        q, k, v = F.linear(h, self.qkv).split([qh, kh, kh], dim=-1)
        q = c.rms_norm(q.unflatten(-1, (s.heads, s.head_size)), self.q_norm, s.eps).flatten(-2)
        k = c.rms_norm(k.unflatten(-1, (s.kv_heads, s.head_size)), self.k_norm, s.eps).flatten(-2)
        q, k = c.rotary_embedding(positions, q, k, s.head_size, cos_sin_cache, True)
        t = h.shape[0]
        q = q.view(t, s.heads, s.head_size)
        k = k.view(t, s.kv_heads, s.head_size)
        v = v.reshape(t, s.kv_heads, s.head_size)
        if self.decode_context:
            # t sequences of one new token each, over their cached context
            ck = self.kv_cache[0].unsqueeze(0).expand(t, -1, -1, -1)
            cv = self.kv_cache[1].unsqueeze(0).expand(t, -1, -1, -1)
            kk = torch.cat([ck, k.unsqueeze(2)], dim=2)
            vv = torch.cat([cv, v.unsqueeze(2)], dim=2)
            o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, enable_gqa=True).squeeze(2)
        else:
            o = (
                F.scaled_dot_product_attention(
                    q.transpose(0, 1).unsqueeze(0),
                    k.transpose(0, 1).unsqueeze(0),
                    v.transpose(0, 1).unsqueeze(0),
                    is_causal=True,
                    enable_gqa=True,
                )
                .squeeze(0)
                .transpose(0, 1)
            )
        return F.linear(o.reshape(t, qh), self.o)

    def forward(self, positions, h, residual, cos_sin_cache):
        s, c = self.s, self.calls
        if residual is None:
            residual = h
        else:
            residual = h + residual
        h = c.rms_norm(residual, self.input_norm, s.eps)
        h = self.attention(positions, h, cos_sin_cache)
        residual = h + residual
        h = c.rms_norm(residual, self.post_attn_norm, s.eps)
        h = F.linear(c.silu_and_mul(F.linear(h, self.gate_up)), self.down)
        return h, residual


class Decoder(nn.Module):
    """``forward(positions [T], hidden [T, hidden]) -> [T, hidden]``."""

    def __init__(
        self,
        shape: DecoderShape | None = None,
        *,
        impl: str = "opcore",
        decode_context: int | None = None,
        seed: int = 0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.shape = s = shape or DecoderShape()
        calls = _Calls(impl)
        # weights drawn on the device: the CPU would take long for the Llama-sized ones
        g = torch.Generator(device=device).manual_seed(seed)
        self.layers = nn.ModuleList(
            DecoderLayer(s, calls, decode_context, g, dtype) for _ in range(s.layers)
        )
        self.final_norm = nn.Parameter(
            torch.ones(s.hidden, device=device, dtype=dtype), requires_grad=False
        )
        self.calls = calls
        cache = build_cos_sin_cache(s.head_size, s.max_position, device=device)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        residual = None
        h = hidden
        for layer in self.layers:
            h, residual = layer(positions, h, residual, self.cos_sin_cache)
        out = h if residual is None else h + residual  # None: a model without layers
        return self.calls.rms_norm(out, self.final_norm, self.shape.eps)
