"""`AttentionSelectorConfig`: everything a backend's capability check looks at.

One frozen (hashable) value per attention layer shape. Its constructor rejects
configurations that no backend could serve (a head count that does not divide, a
non-positive size) with an error naming the field, so `validate_configuration` only ever
answers "can *this* backend do it".

Conventions:
  * ``kv_cache_dtype`` ``"auto"`` means "the same as ``dtype``"; otherwise a name such as
    ``"float16"``, ``"bfloat16"``, ``"float32"``, ``"fp8_e4m3"``.
  * ``sliding_window`` ``W`` lets the query at absolute position ``p`` see the keys at
    positions ``p - W < j <= p`` (``W`` keys including itself); ``None`` means no window.
  * ``logits_soft_cap`` ``c`` replaces each score ``s`` by ``c * tanh(s / c)``.
  * ``block_size`` ``None`` means the caller has not fixed one (any size the backend
    prefers); ``device_type`` ``None`` means "not known" and skips device checks.
"""

from __future__ import annotations

import dataclasses

import torch

_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"`` (the spelling used in reasons and kv dtypes)."""
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


@dataclasses.dataclass(frozen=True)
class AttentionSelectorConfig:
    """What an attention layer needs from a backend. See the module docstring."""

    head_size: int
    num_heads: int
    num_kv_heads: int
    dtype: torch.dtype = torch.float16
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    sliding_window: int | None = None
    causal: bool = True
    logits_soft_cap: float | None = None
    device_type: str | None = None

    def __post_init__(self) -> None:
        for field in ("head_size", "num_heads", "num_kv_heads"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(
                    f"AttentionSelectorConfig: {field} must be a positive int, got {value!r}"
                )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"AttentionSelectorConfig: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if not isinstance(self.dtype, torch.dtype):
            raise ValueError(
                f"AttentionSelectorConfig: dtype must be a torch.dtype, got {self.dtype!r}"
            )
        if self.block_size is not None and (
            not isinstance(self.block_size, int) or self.block_size <= 0
        ):
            raise ValueError(
                "AttentionSelectorConfig: block_size must be a positive int or None, got "
                f"{self.block_size!r}"
            )
        if self.sliding_window is not None and (
            not isinstance(self.sliding_window, int) or self.sliding_window <= 0
        ):
            raise ValueError(
                "AttentionSelectorConfig: sliding_window must be a positive int or None, "
                f"got {self.sliding_window!r}"
            )
        if self.logits_soft_cap is not None and not self.logits_soft_cap > 0:
            raise ValueError(
                "AttentionSelectorConfig: logits_soft_cap must be > 0 or None, "
                f"got {self.logits_soft_cap!r}"
            )
        if not isinstance(self.kv_cache_dtype, str) or not self.kv_cache_dtype:
            raise ValueError(
                "AttentionSelectorConfig: kv_cache_dtype must be a name such as 'auto', got "
                f"{self.kv_cache_dtype!r}"
            )

    @property
    def queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def resolved_kv_cache_dtype(self) -> str:
        """``kv_cache_dtype`` with ``"auto"`` replaced by the name of ``dtype``."""
        return dtype_name(self.dtype) if self.kv_cache_dtype == "auto" else self.kv_cache_dtype

    def as_dict(self) -> dict:
        """Plain data (dtype as its name) for logs and `selection_info`."""
        out = dataclasses.asdict(self)
        out["dtype"] = dtype_name(self.dtype)
        return out
