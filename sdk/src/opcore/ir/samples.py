"""`SampleInput`: one named set of arguments for an op, and moving samples to a device.

Generators build samples on the CPU, each sample's random draws starting from a seed made
from its op's and its own name (`sample_seed`), so every device, mode (quick or full) and
selection sees the same values under the same name; `SampleInput.to` then moves them while
keeping their layout: a view (such as q, k, v sliced from one QKV buffer) stays a view with
the same strides and offset, and views of one buffer stay views of one moved buffer.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

SEED = 0x0C0DE  # mixed into every sample's seed (`sample_seed`)

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


def sample_seed(op_name: str, sample_name: str) -> int:
    """The seed of one sample: a stable hash (SHA-256, not Python's per-process ``hash()``)
    of `SEED`, the op's name and the sample's name; the dtype is not part of it, so the
    same name draws the same values for every dtype (`randn` draws in fp32, then casts)."""
    digest = hashlib.sha256(f"{SEED}:{op_name}:{sample_name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# The names each generator yields, per (op, generator, dtype, quick): found by one run
# with a throwaway seed (names never depend on the values drawn; checked below).
_NAMES: dict[tuple[str, Any, Any, bool], list[str]] = {}


def seeded_samples(
    op_name: str, fn: SampleGenerator, dtype: torch.dtype, *, quick: bool
) -> Iterator[SampleInput]:
    """Run the generator ``fn`` so that the draws made for each sample start from
    `sample_seed` of its name: the generator is reseeded before each step, with the name
    of the sample that step yields. A sample is then the same in quick and full mode,
    whatever samples precede it. Draws between two yields belong to the sample yielded
    next (samples yielded together from one draw, such as the NeoX and GPT-J styles of one
    shape, share it)."""
    key = (op_name, fn, dtype, quick)
    names = _NAMES.get(key)
    if names is None:
        names = [
            s.name for s in fn(dtype, quick=quick, generator=torch.Generator().manual_seed(SEED))
        ]
        _NAMES[key] = names
    generator = torch.Generator()
    produced = iter(fn(dtype, quick=quick, generator=generator))
    for name in names:
        generator.manual_seed(sample_seed(op_name, name))
        sample = next(produced, None)
        if sample is None or sample.name != name:
            raise RuntimeError(
                f"op {op_name!r}: the sample generator yielded "
                f"{None if sample is None else sample.name!r} where an earlier run yielded "
                f"{name!r}: sample names must not depend on the values drawn"
            )
        yield sample


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


def randn(
    shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator, *, scale: float = 1.0
) -> torch.Tensor:
    """A CPU tensor drawn in fp32 from ``generator`` then cast (same values for every dtype)."""
    return (torch.randn(shape, generator=generator, dtype=torch.float32) * scale).to(dtype)
