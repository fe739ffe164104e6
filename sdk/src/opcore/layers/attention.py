"""`Attention`: the paged-attention layer. It asks the attention selector for a backend
and owns its KV cache.

    attn = Attention(num_heads=32, head_size=128, scale=128**-0.5, num_kv_heads=8,
                     dtype=torch.bfloat16, block_size=16)
    attn.allocate_kv_cache(num_blocks=1024)
    out = attn(query, key, value, metadata)   # metadata: opcore.attention.PagedAttentionMetadata

Construction runs `opcore.attention.select_backend` once (explicit ``backend=`` argument,
else ``OpcoreConfig.attention.backend`` / ``OPCORE_ATTENTION_BACKEND``, else the platform's
candidates) and fails with the selector's reasons if no backend can serve the layer.
``forward`` writes the new key/value rows into the cache by ``metadata.slot_mapping``
(negative slots skipped), then attends over the block tables. Query, key and value may be
``[num_tokens, heads, head_size]`` or flattened ``[num_tokens, heads * head_size]``; the
output has the query's shape.

The layer is a `PluggableLayer` registered as ``"attention"``: a plugin may replace the
whole module with ``Attention.register_oot``; to change only the kernels, a plugin
registers a backend instead (docs/attention.md).
"""

from __future__ import annotations

import torch

from opcore.attention import AttentionSelectorConfig, PagedAttentionMetadata, select_backend
from opcore.layers.custom_op import PluggableLayer


@PluggableLayer.register("attention")
class Attention(PluggableLayer):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        *,
        dtype: torch.dtype | None = None,
        kv_cache_dtype: str = "auto",
        block_size: int = 16,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        causal: bool = True,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.dtype = dtype or torch.get_default_dtype()
        self.block_size = block_size
        self.selector_config = AttentionSelectorConfig(
            head_size=head_size,
            num_heads=num_heads,
            num_kv_heads=self.num_kv_heads,
            dtype=self.dtype,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            sliding_window=sliding_window,
            causal=causal,
            logits_soft_cap=logits_soft_cap,
        )
        self.selection = select_backend(self.selector_config, backend)
        backend_cls, backend_name = self.selection.backend_cls, self.selection.selected
        # select_backend raises when no backend is valid: a returned selection has both.
        assert backend_cls is not None and backend_name is not None
        self.backend_cls = backend_cls
        self._backend_name = backend_name
        self.impl = self.backend_cls(
            num_heads,
            head_size,
            self.num_kv_heads,
            scale,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
            causal=causal,
        )
        self.kv_cache: torch.Tensor | None = None

    @property
    def backend_name(self) -> str:
        return self._backend_name

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return tuple(
            self.backend_cls.get_kv_cache_shape(
                num_blocks, self.block_size, self.num_kv_heads, self.head_size
            )
        )

    def allocate_kv_cache(
        self, num_blocks: int, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """Allocate (zeroed) and own a cache of ``num_blocks`` blocks on ``device``
        (default: the current platform's device 0)."""
        if device is None:
            from opcore.platforms import get_current_platform

            device = get_current_platform().device()
        cache = self.backend_cls.allocate_kv_cache(
            num_blocks, self.block_size, self.num_kv_heads, self.head_size, self.dtype, device
        )
        self.kv_cache = cache.zero_()
        return self.kv_cache

    def bind_kv_cache(self, kv_cache: torch.Tensor, num_blocks: int) -> None:
        """Own a cache of ``num_blocks`` blocks allocated elsewhere (e.g. one slice of a
        pool shared by layers); its shape must be the backend's cache shape."""
        expected = self.kv_cache_shape(num_blocks)
        if tuple(kv_cache.shape) != expected:
            raise ValueError(
                f"Attention.bind_kv_cache: kv_cache must have shape {expected} for backend "
                f"{self.backend_name} (num_blocks={num_blocks}, block_size={self.block_size}, "
                f"num_kv_heads={self.num_kv_heads}, head_size={self.head_size}), "
                f"got {tuple(kv_cache.shape)}"
            )
        if kv_cache.dtype != self.dtype:
            raise ValueError(
                f"Attention.bind_kv_cache: kv_cache dtype {kv_cache.dtype} is not the layer's "
                f"{self.dtype}"
            )
        self.kv_cache = kv_cache

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        metadata: PagedAttentionMetadata,
    ) -> torch.Tensor:
        if self.kv_cache is None:
            raise RuntimeError(
                "Attention.forward: no kv cache; call allocate_kv_cache or bind_kv_cache first"
            )
        if (key is None) != (value is None):
            raise ValueError(
                "Attention.forward: pass both key and value, or neither (attend to the cache only)"
            )
        q = self._heads("query", query, self.num_heads)
        if key is not None and value is not None:  # both or neither (checked above)
            if metadata.slot_mapping is None:
                raise ValueError(
                    "Attention.forward: metadata.slot_mapping is required to write key and value"
                )
            self.impl.write_kv(
                self._heads("key", key, self.num_kv_heads),
                self._heads("value", value, self.num_kv_heads),
                self.kv_cache,
                metadata.slot_mapping,
            )
        out = self.impl.forward(q, self.kv_cache, metadata)
        return out.reshape(query.shape)

    def _heads(self, arg: str, t: torch.Tensor, heads: int) -> torch.Tensor:
        if t.dim() == 2:
            if t.shape[1] != heads * self.head_size:
                raise ValueError(
                    f"Attention.forward: {arg} of shape {tuple(t.shape)} is not [num_tokens, "
                    f"{heads} * {self.head_size}]"
                )
            return t.view(t.shape[0], heads, self.head_size)
        return t

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_size={self.head_size}, block_size={self.block_size}, "
            f"backend={self.backend_name}"
        )
