"""Helpers for an op's outputs, shared by eager dispatch and the compile passes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def map_outputs(out: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` applied to ``out`` (a tensor) or to each tensor of ``out`` (a tuple)."""
    if isinstance(out, torch.Tensor):
        return fn(out)
    return tuple(fn(o) if isinstance(o, torch.Tensor) else o for o in out)


def fresh_outputs(out: Any, args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """``out`` made contiguous, with any output that shares storage with an input tensor
    copied: a custom op's outputs must not alias its inputs."""
    inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    ptrs = {t.untyped_storage().data_ptr() for t in inputs if t.device.type != "meta"}

    def fix(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta" and t.untyped_storage().data_ptr() in ptrs:
            return t.clone(memory_format=torch.contiguous_format)
        return t.contiguous()

    return map_outputs(out, fix)
