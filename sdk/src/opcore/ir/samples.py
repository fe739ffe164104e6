"""`SampleInput`: one named set of arguments for an op, and moving samples to a device.

Generators build samples on the CPU from a fixed seed, so every device sees the same
values; `SampleInput.to` then moves them while keeping their layout: a view (such as q,
k, v sliced from one QKV buffer) stays a view with the same strides and offset, and views
of one buffer stay views of one moved buffer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

SEED = 0x0C0DE

SampleGenerator = Callable[..., Iterable["SampleInput"]]
"""``fn(dtype, *, quick, generator) -> iterable of SampleInput`` (tensors on the CPU)."""


@dataclasses.dataclass
class SampleInput:
    """Arguments for one call: ``op(*args, **kwargs)``; ``name`` identifies the case
    (stable across runs, unique within an op's samples for a dtype and mode)."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to(self, device: torch.device | str) -> SampleInput:
        device = torch.device(device)
        memo: dict[int, torch.Tensor] = {}
        args = tuple(_move(a, device, memo) for a in self.args)
        kwargs = {k: _move(v, device, memo) for k, v in self.kwargs.items()}
        return SampleInput(self.name, args, kwargs)

    def clone(self) -> SampleInput:
        """A copy whose tensors share no memory with these (views stay views of one new
        buffer), for checking that a call mutates nothing."""
        memo: dict[int, torch.Tensor] = {}
        args = tuple(_move(a, None, memo) for a in self.args)
        kwargs = {k: _move(v, None, memo) for k, v in self.kwargs.items()}
        return SampleInput(self.name, args, kwargs)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for i, a in enumerate(self.args):
            if isinstance(a, torch.Tensor):
                yield str(i), a
        for k, v in self.kwargs.items():
            if isinstance(v, torch.Tensor):
                yield k, v


def _move(value: Any, device: torch.device | None, memo: dict[int, torch.Tensor]) -> Any:
    """Move (or with ``device=None`` copy) ``value`` keeping strides and view sharing."""
    if not isinstance(value, torch.Tensor):
        return value
    if device is not None and value.device == device:
        return value
    base = value._base if value._base is not None else value
    key = id(base)
    if key not in memo:
        flat = base.as_strided((base.untyped_storage().nbytes() // base.element_size(),), (1,), 0)
        memo[key] = flat.to(device) if device is not None else flat.clone()
    storage = memo[key]
    return storage.as_strided(value.shape, value.stride(), value.storage_offset())


def randn(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator, *, scale: float = 1.0) -> torch.Tensor:
    """A CPU tensor drawn in fp32 from ``generator`` then cast (same values for every dtype)."""
    return (torch.randn(shape, generator=generator, dtype=torch.float32) * scale).to(dtype)
