"""The replacement forwards, as mixins put in front of the transformers classes.

A patched module's class becomes ``type("Opcore" + cls.__name__, (Mixin, cls), {})``
(see `_patch`): the module keeps its parameters, buffers, hooks and state-dict names and is
still an instance of its transformers class; only ``forward`` (and ``_apply`` where fused
buffers must follow ``.to()``) change. Every forward computes the same function as the
transformers code it replaces through `opcore.ir.ops`, so the platform's priority picks the
kernel:

- RMSNorm -> ``rms_norm``;
- decoder layer -> the post-attention residual add and RMSNorm as one ``fused_add_rms_norm``
  (the residual add after the MLP stays a plain add: the next layer's input norm is in
  the next module);
- MLP -> ``silu_and_mul`` / ``gelu_and_mul`` on one gate-up GEMM (fused weights) or on the
  two projections' outputs concatenated (when the weights cannot be fused);
- rotary embedding -> returns ``(cos_sin_cache, positions)`` instead of ``(cos, sin)``;
  the attention hands both to ``rotary_embedding`` (NeoX style), or, for Qwen3's per-head
  q/k RMSNorm, to one ``split_qkv_rmsnorm_rope`` call. Without the rotary op (``ops=``),
  the attention is transformers' own with the ``apply_rotary_pos_emb`` kept at import.

No forward here reads a name of the modeling module when it runs: the functions it calls
(``eager_attention_forward``, ``apply_rotary_pos_emb``) are transformers' own, kept when the
integration was imported, so another library rebinding them later changes no patched model.

Numerics: the ops compute in fp32 and cast once, where transformers rounds in between
(the norm before its weight, cos/sin before the rotation), so fp32 results agree to
rounding and half-precision results within the ops' tolerances.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from opcore.integrations.transformers import _fuse
from opcore.ir import ops

# Attribute names the patch sets on a module's __dict__ (removed by revert).
ATTRS = (
    "_opcore_gelu",
    "_opcore_fused_groups",
    "_opcore_qk_norm",
    "_opcore_cache_kwargs",
    "_opcore_num_heads",
    "_opcore_num_kv_heads",
    "_opcore_sliding",
    "_opcore_eager_attention",
    "_opcore_apply_rotary",
    "_opcore_cache_rows",
)

if TYPE_CHECKING:

    class _Host:
        """For the type checker only: a mixin reads the attributes of the transformers
        module it is put in front of (and the ``ATTRS`` the patch set), which vary by
        model and are untyped here."""

        def __getattr__(self, name: str) -> Any: ...

else:
    _Host = object


class RMSNormMixin(_Host):
    """``forward(x) = rms_norm(x, weight, variance_epsilon)``."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(hidden_states, self.weight, self.variance_epsilon)


class FusedBuffersMixin(_Host):
    """Re-point fused parameters at their buffers after ``_apply`` (``.to()``, ``.half()``)."""

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        for name, children in self._opcore_fused_groups.items():
            _fuse.retie(self, name, [getattr(self, c) for c in children])
        return out


def _gated(module: Any, gate_up: torch.Tensor) -> torch.Tensor:
    approximate = module._opcore_gelu
    if approximate is None:
        return ops.silu_and_mul(gate_up)
    return ops.gelu_and_mul(gate_up, approximate)


def _grad_needed(*linears) -> bool:
    # The fused buffers are not parameters: autograd would not reach the projections'
    # weights through them, so a forward that records gradients uses the projections.
    return torch.is_grad_enabled() and any(lin.weight.requires_grad for lin in linears)


class FusedMLPMixin(FusedBuffersMixin):
    """``down(act_and_mul(x @ [gate; up]^T))``: one GEMM for gate and up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _grad_needed(self.gate_proj, self.up_proj):
            gate_up = torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1)
        else:
            gate_up = F.linear(x, self._opcore_gate_up_weight, self._opcore_gate_up_bias)
        return self.down_proj(_gated(self, gate_up))


class SplitMLPMixin(_Host):
    """``down(act_and_mul(cat(gate(x), up(x))))``: the projections run as they are."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1)
        return self.down_proj(_gated(self, gate_up))


class RotaryMixin(_Host):
    """``forward(x, position_ids) -> (cos_sin_cache, positions)``, positions one per token
    of ``x``.

    The cache (``[max_position_embeddings, rotary_dim]``, fp32: cos then sin of
    ``position * inv_freq``, times the rope type's ``attention_scaling``) is a
    non-persistent buffer built once by `build_cache`; the patched attention reads it.
    It is built when the patch is applied, or, for a model patched on the meta device, on
    the first forward whose ``inv_freq`` is on a real device (after ``to_empty``, the
    weight load and the ``inv_freq`` initialisation that the unpatched model needs too)."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        cache = self._buffers.get("_opcore_cos_sin_cache")
        if cache is None:
            cache = build_cache(self, self._opcore_cache_rows)
            if not cache.is_meta:
                self.register_buffer("_opcore_cos_sin_cache", cache, persistent=False)
        # `x` is the layers' input [batch, seq, hidden]; the ops want one position per
        # token, so a [1, seq] position_ids is expanded here once, not in every layer, and
        # made contiguous: an expanded [batch, 1] flattens to a stride-0 view, which the
        # Triton kernels read as if contiguous (past its one element).
        lead = x.shape[:-1]
        if position_ids.shape != lead:
            position_ids = position_ids.expand(lead)
        if not position_ids.is_contiguous():
            position_ids = position_ids.contiguous()
        return cache, position_ids


def build_cache(rotary: Any, max_position: int) -> torch.Tensor:
    """The rotary module's cos/sin rows for positions ``0 .. max_position - 1``, computed
    as transformers computes them (fp32 ``position * inv_freq``, then cos/sin, times
    ``attention_scaling``)."""
    inv_freq = rotary.inv_freq.to(torch.float32)
    pos = torch.arange(max_position, device=inv_freq.device, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    scale = rotary.attention_scaling
    return torch.cat((freqs.cos() * scale, freqs.sin() * scale), dim=-1).contiguous()


class DecoderLayerMixin(_Host):
    """The pre-norm decoder layer with the post-attention residual add fused into its
    RMSNorm: ``h, residual = fused_add_rms_norm(attn_out, residual)``."""

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states, attention_mask=attention_mask, **kwargs
        )
        norm = self.post_attention_layernorm
        hidden_states, residual = ops.fused_add_rms_norm(
            hidden_states, residual, norm.weight, norm.variance_epsilon
        )
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states


class AttentionMixin(FusedBuffersMixin):
    """Projections (one fused QKV GEMM when the weights allow), rotary through
    ``rotary_embedding`` (or Qwen3's q/k norm + rotary through ``split_qkv_rmsnorm_rope``),
    then the transformers attention interface, KV cache and output projection as in
    transformers' own forward. Without the rotary op (``_opcore_apply_rotary`` set), q, k
    and v are transformers' own: the projections, Qwen3's q/k norm modules, and the
    ``apply_rotary_pos_emb`` kept at import on the rotary module's ``(cos, sin)``."""

    def _opcore_qkv(self, hidden_states: torch.Tensor, position_embeddings):
        """q, k, v ``[batch, heads, seq, head_dim]`` through the opcore ops."""
        cos_sin_cache, positions = position_embeddings
        lead = hidden_states.shape[:-1]
        if cos_sin_cache.dim() != 2 or positions.is_floating_point():
            raise RuntimeError(
                "opcore: this attention was patched but received (cos, sin) position embeddings; "
                "the model's rotary embedding is not patched (apply opcore to the whole model)"
            )
        if positions.shape != lead:
            positions = positions.expand(lead)
        d = self.head_dim
        hq, hk = self._opcore_num_heads * d, self._opcore_num_kv_heads * d
        fused = "qkv" in self._opcore_fused_groups and not _grad_needed(
            self.q_proj, self.k_proj, self.v_proj
        )
        if self._opcore_qk_norm:
            if fused:
                qkv = F.linear(hidden_states, self._opcore_qkv_weight, self._opcore_qkv_bias)
            else:
                qkv = torch.cat(
                    (
                        self.q_proj(hidden_states),
                        self.k_proj(hidden_states),
                        self.v_proj(hidden_states),
                    ),
                    dim=-1,
                )
            q, k, v = ops.split_qkv_rmsnorm_rope(
                qkv, self.q_norm.weight, self.k_norm.weight, self.q_norm.variance_epsilon,
                positions, cos_sin_cache, self._opcore_num_heads, self._opcore_num_kv_heads,
                d, True,
            )  # fmt: skip
        else:
            if fused:
                qkv = F.linear(hidden_states, self._opcore_qkv_weight, self._opcore_qkv_bias)
                q, k, v = qkv[..., :hq], qkv[..., hq : hq + hk], qkv[..., hq + hk :]
            else:
                q, k, v = (
                    self.q_proj(hidden_states),
                    self.k_proj(hidden_states),
                    self.v_proj(hidden_states),
                )
            q, k = ops.rotary_embedding(positions, q, k, d, cos_sin_cache, True)
        shape = (*lead, -1, d)
        query_states = q.reshape(shape).transpose(1, 2)
        key_states = k.reshape(shape).transpose(1, 2)
        value_states = v.reshape(shape).transpose(1, 2)
        return query_states, key_states, value_states

    def _transformers_qkv(self, hidden_states: torch.Tensor, position_embeddings):
        """q, k, v as transformers' attention computes them (the rotary op not chosen),
        with its ``apply_rotary_pos_emb`` as kept at import."""
        cos, sin = position_embeddings
        if not cos.is_floating_point() or cos.dim() == 2:
            raise RuntimeError(
                "opcore: this attention was patched without the rotary op but received "
                "(cos_sin_cache, positions); revert the model and patch it once, whole"
            )
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape)
        k = self.k_proj(hidden_states).view(shape)
        if self._opcore_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        q, k = self._opcore_apply_rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q, k, v

    def forward(
        self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None, **kwargs
    ):
        # transformers 5.17 names the KV cache `past_key_values`, later versions `cache`
        # (accepting the old name); take whichever the caller used.
        cache = kwargs.pop("cache", None)
        old = kwargs.pop("past_key_values", None)
        cache = old if cache is None else cache
        lead = hidden_states.shape[:-1]
        if self._opcore_apply_rotary is not None:
            query_states, key_states, value_states = self._transformers_qkv(
                hidden_states, position_embeddings
            )
        else:
            query_states, key_states, value_states = self._opcore_qkv(
                hidden_states, position_embeddings
            )

        if cache is not None:
            if self._opcore_cache_kwargs:
                key_states, value_states = cache.update(
                    key_states, value_states, self.layer_idx, kwargs=kwargs
                )
            else:
                key_states, value_states = cache.update(key_states, value_states, self.layer_idx)

        attn_fn = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, self._opcore_eager_attention
        )
        extra = {}
        sliding = self._opcore_sliding
        if sliding == "layer":  # Qwen2 / Qwen3: per layer type
            extra["sliding_window"] = self.sliding_window
        elif sliding == "config":  # Mistral: from the config
            extra["sliding_window"] = getattr(self.config, "sliding_window", None)
        attn_output, attn_weights = attn_fn(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling, **extra, **kwargs,
        )  # fmt: skip
        attn_output = attn_output.reshape(*lead, -1).contiguous()
        return self.o_proj(attn_output), attn_weights
