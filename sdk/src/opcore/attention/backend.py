"""`AttentionBackend`: the base every attention backend subclasses.

A backend declares what it can do as class attributes and answers
`validate_configuration(cfg) -> list[str]`: an empty list means "I can serve ``cfg``",
otherwise one human-readable reason per unmet requirement. The selector
(`opcore.attention.selector`) never looks at anything else, so a backend's declarations are
its whole contract with the core.

Declarations (class attributes; the defaults are the conservative ones):

  ``name``                      the registry name (``"TRITON_PAGED"``).
  ``supported_dtypes``          query/key/value dtypes.
  ``supported_kv_cache_dtypes`` kv-cache dtype names; ``"auto"`` = same as the model dtype.
  ``supported_head_sizes``      exact head sizes; empty = any.
  ``supported_block_sizes``     exact ints and/or `MultipleOf(n)`; a configured block size is
                                valid if it equals an int or is a multiple of some ``n``.
  ``supported_device_types``    torch device types (``"cuda"``, ``"cpu"``); empty = any.
  ``supports_gqa`` / ``supports_mqa``      num_kv_heads < num_heads (> 1 / == 1).
  ``supports_sliding_window``, ``supports_causal``, ``supports_non_causal``,
  ``supports_logits_soft_cap``.

Provider properties (docs/properties.md), for decode batches (one new token per
sequence; "a row" is a sequence): ``properties`` (class attribute, names from
`opcore.properties.PROPERTY_NAMES`), `declared_properties` (an instance's, which may depend
on its settings) and `property_variants` (the settings under which they differ, each
checked by the conformance suite).

Hooks a backend may override: `unavailable_reason` (a missing dependency or driver),
`supports_combination` (a free-form veto for combinations the flags cannot express),
`get_kv_cache_shape`.

Paged-KV contract (instances; see `opcore.attention.paged` for the metadata):

  * ``kv_cache = Backend.allocate_kv_cache(num_blocks, block_size, num_kv_heads, head_size,
    dtype, device)`` has shape ``Backend.get_kv_cache_shape(...)``.
  * ``impl = Backend(num_heads, head_size, num_kv_heads, scale, sliding_window=...,
    logits_soft_cap=..., causal=...)``.
  * ``impl.write_kv(key, value, kv_cache, slot_mapping)`` stores row ``t`` of ``key`` and
    ``value`` (``[num_tokens, num_kv_heads, head_size]``) at slot ``slot_mapping[t]``
    (slot ``s`` is block ``s // block_size``, offset ``s % block_size``); a negative slot
    is skipped.
  * ``impl.forward(query, kv_cache, metadata) -> out`` with ``query`` and ``out`` of shape
    ``[num_tokens, num_heads, head_size]``: each sequence's new tokens attend to its
    whole context (already written, new tokens included) read through its block table.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import torch

from opcore.attention.selector_config import AttentionSelectorConfig, dtype_name

if TYPE_CHECKING:
    from opcore.attention.paged import PagedAttentionMetadata


@dataclasses.dataclass(frozen=True)
class MultipleOf:
    """A block-size declaration: any positive multiple of ``n``."""

    n: int

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n <= 0:
            raise ValueError(f"MultipleOf: n must be a positive int, got {self.n!r}")

    def __str__(self) -> str:
        return "any size" if self.n == 1 else f"multiples of {self.n}"


def _fmt_sizes(sizes) -> str:
    return ", ".join(str(s) for s in sizes)


class AttentionBackend:
    """Base class of every attention backend. See the module docstring for the contract."""

    name: ClassVar[str] = ""
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float16, torch.bfloat16)
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    supported_head_sizes: ClassVar[tuple[int, ...]] = ()
    supported_block_sizes: ClassVar[tuple[int | MultipleOf, ...]] = (MultipleOf(1),)
    supported_device_types: ClassVar[tuple[str, ...]] = ()
    supports_gqa: ClassVar[bool] = False
    supports_mqa: ClassVar[bool] = False
    supports_sliding_window: ClassVar[bool] = False
    supports_causal: ClassVar[bool] = True
    supports_non_causal: ClassVar[bool] = False
    supports_logits_soft_cap: ClassVar[bool] = False
    properties: ClassVar[frozenset[str]] = frozenset()

    # ------------------------------------------------------------------ properties
    def declared_properties(self) -> frozenset[str]:
        """The properties this instance has (docs/properties.md). Default: the class's
        ``properties``; a backend whose properties follow a setting answers per
        instance."""
        return frozenset(self.properties)

    @classmethod
    def property_variants(cls) -> dict[str, dict[str, object]]:
        """``{variant name: {instance attribute: value}}``: the settings under which this
        backend's properties differ; the conformance suite checks each variant. Default:
        one, ``default``, with no setting changed."""
        return {"default": {}}

    # ------------------------------------------------------------------ capabilities
    @classmethod
    def unavailable_reason(cls, device_type: str | None) -> str | None:
        """Why this backend cannot run at all in this process on ``device_type`` (a
        dependency that does not import, a driver that is missing), or ``None``.
        Default: always available."""
        return None

    @classmethod
    def supports_combination(cls, cfg: AttentionSelectorConfig) -> str | None:
        """A reason this particular combination is unsupported, or ``None``. Default: none."""
        return None

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return not cls.supported_head_sizes or head_size in cls.supported_head_sizes

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        if block_size is None:
            return True
        for size in cls.supported_block_sizes:
            if isinstance(size, MultipleOf):
                if block_size % size.n == 0:
                    return True
            elif block_size == size:
                return True
        return False

    @classmethod
    def supports_kv_cache_dtype(cls, cfg: AttentionSelectorConfig) -> bool:
        # "auto" in the declarations means "whatever the model dtype is"; a config asking
        # for its own dtype by name is the same request.
        if cfg.kv_cache_dtype in cls.supported_kv_cache_dtypes:
            return True
        return (
            "auto" in cls.supported_kv_cache_dtypes
            and cfg.resolved_kv_cache_dtype == dtype_name(cfg.dtype)
        )

    @classmethod
    def validate_configuration(cls, cfg: AttentionSelectorConfig) -> list[str]:
        """Every reason this backend cannot serve ``cfg``; empty when it can."""
        reasons: list[str] = []
        unavailable = cls.unavailable_reason(cfg.device_type)
        if unavailable:
            reasons.append(unavailable)
        if (
            cls.supported_device_types
            and cfg.device_type is not None
            and cfg.device_type not in cls.supported_device_types
        ):
            reasons.append(
                f"device type {cfg.device_type!r} not supported "
                f"(supported: {', '.join(cls.supported_device_types)})"
            )
        if cfg.dtype not in cls.supported_dtypes:
            reasons.append(
                f"dtype {dtype_name(cfg.dtype)} not supported "
                f"(supported: {', '.join(dtype_name(d) for d in cls.supported_dtypes)})"
            )
        if not cls.supports_kv_cache_dtype(cfg):
            reasons.append(
                f"kv_cache_dtype {cfg.kv_cache_dtype!r} not supported "
                f"(supported: {', '.join(cls.supported_kv_cache_dtypes)})"
            )
        if not cls.supports_head_size(cfg.head_size):
            reasons.append(
                f"head_size {cfg.head_size} not supported "
                f"(supported: {_fmt_sizes(cls.supported_head_sizes)})"
            )
        if not cls.supports_block_size(cfg.block_size):
            reasons.append(
                f"block_size {cfg.block_size} not supported "
                f"(supported: {_fmt_sizes(cls.supported_block_sizes)})"
            )
        if cfg.num_kv_heads < cfg.num_heads:
            if cfg.num_kv_heads == 1 and not cls.supports_mqa:
                reasons.append(
                    f"multi-query attention (num_heads {cfg.num_heads}, 1 kv head) not supported"
                )
            elif cfg.num_kv_heads > 1 and not cls.supports_gqa:
                reasons.append(
                    f"grouped-query attention (num_heads {cfg.num_heads}, "
                    f"num_kv_heads {cfg.num_kv_heads}) not supported"
                )
        if cfg.sliding_window is not None and not cls.supports_sliding_window:
            reasons.append("sliding window not supported")
        if cfg.causal and not cls.supports_causal:
            reasons.append("causal attention not supported")
        if not cfg.causal and not cls.supports_non_causal:
            reasons.append("non-causal attention not supported")
        if cfg.logits_soft_cap is not None and not cls.supports_logits_soft_cap:
            reasons.append("logits soft-cap not supported")
        veto = cls.supports_combination(cfg)
        if veto:
            reasons.append(veto)
        return reasons

    @classmethod
    def capabilities(cls) -> dict:
        """The declarations as plain data (for `opcore info` and docs)."""
        return {
            "dtypes": [dtype_name(d) for d in cls.supported_dtypes],
            "kv_cache_dtypes": list(cls.supported_kv_cache_dtypes),
            "head_sizes": list(cls.supported_head_sizes) or "any",
            "block_sizes": [str(s) for s in cls.supported_block_sizes],
            "device_types": list(cls.supported_device_types) or "any",
            "gqa": cls.supports_gqa,
            "mqa": cls.supports_mqa,
            "sliding_window": cls.supports_sliding_window,
            "causal": cls.supports_causal,
            "non_causal": cls.supports_non_causal,
            "logits_soft_cap": cls.supports_logits_soft_cap,
        }

    # ------------------------------------------------------------------ paged KV cache
    @classmethod
    def get_kv_cache_shape(
        cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """Shape of this backend's cache tensor. Default: keys and values stacked,
        ``(2, num_blocks, block_size, num_kv_heads, head_size)``."""
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def allocate_kv_cache(
        cls,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> torch.Tensor:
        """An uninitialised cache tensor of `get_kv_cache_shape`."""
        shape = cls.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
        return torch.empty(shape, dtype=dtype, device=device)

    # ------------------------------------------------------------------ instances
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        num_kv_heads: int,
        scale: float,
        *,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        causal: bool = True,
    ) -> None:
        # Reuse the config's argument checks (head counts, window, soft-cap).
        AttentionSelectorConfig(
            head_size=head_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
            causal=causal,
        )
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = float(scale)
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.causal = causal

    def split_kv_cache(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(key_cache, value_cache)``, each ``[num_blocks, block_size, num_kv_heads,
        head_size]``, after checking ``kv_cache`` against this layer. Backends with another
        layout override this together with `get_kv_cache_shape`."""
        if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
            raise ValueError(
                f"{self.name}: kv_cache must have shape (2, num_blocks, block_size, num_kv_heads, "
                f"head_size), got {tuple(kv_cache.shape)}"
            )
        if kv_cache.shape[3] != self.num_kv_heads or kv_cache.shape[4] != self.head_size:
            raise ValueError(
                f"{self.name}: kv_cache has {kv_cache.shape[3]} kv heads of size "
                f"{kv_cache.shape[4]}, but the layer has num_kv_heads={self.num_kv_heads}, "
                f"head_size={self.head_size}"
            )
        return kv_cache[0], kv_cache[1]

    def check_write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The checks every `write_kv` makes before writing (head counts and sizes, one
        slot per key row, dtypes that match the cache, slots in range: for a batch's own
        ``metadata.slot_mapping`` through the batch's per-batch check, on the host, else on
        the device); returns ``split_kv_cache(kv_cache)``. Raises ``ValueError`` naming the
        argument."""
        from opcore.attention.paged import check_qkv, check_slot_mapping, checked_slots

        check_qkv(
            self.name, self.num_heads, self.num_kv_heads, self.head_size, key=key, value=value
        )
        key_cache, value_cache = self.split_kv_cache(kv_cache)
        num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
        if slot_mapping.dim() != 1 or slot_mapping.numel() != key.shape[0]:
            raise ValueError(
                f"{self.name}: slot_mapping must be 1-D with one slot per key row "
                f"({key.shape[0]}), got shape {tuple(slot_mapping.shape)}"
            )
        if key.dtype != key_cache.dtype or value.dtype != value_cache.dtype:
            raise ValueError(
                f"{self.name}: key/value dtype {key.dtype}/{value.dtype} differs from kv_cache "
                f"dtype {key_cache.dtype}"
            )
        # A batch's own slots were checked on its host copies (once per batch); others are
        # checked here, on the device (a wait for it).
        if not checked_slots(slot_mapping, num_blocks, block_size):
            check_slot_mapping(slot_mapping, num_blocks * block_size, num_blocks, block_size)
        return key_cache, value_cache

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store new key/value rows into ``kv_cache`` by ``slot_mapping`` (see module doc).
        Implementations start with `check_write_kv`."""
        raise NotImplementedError(f"{type(self).__name__} does not implement write_kv")

    def forward(
        self,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: PagedAttentionMetadata,
    ) -> torch.Tensor:
        """Attention of ``query`` over the paged context described by ``metadata``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement forward")
