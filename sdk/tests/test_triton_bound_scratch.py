"""`_bound`'s scratch memory for kernels that ask for it at launch (tensor descriptors made
on the device): torch's allocator serves it inside the launch, and an allocator the caller
set on Triton stays theirs. Triton keeps its allocator in a context variable, read here
through Triton's own module since it has no public getter."""

from __future__ import annotations

import contextvars

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.runtime import _allocation  # noqa: E402

from opcore.kernels.triton import _bound  # noqa: E402


def test_scratch_comes_from_torch_inside_the_launch_and_the_callers_allocator_stays():
    # In a context of its own, so the allocator set here leaves no trace in other tests.
    contextvars.copy_context().run(_check)


def _check():
    def callers(size, alignment, stream):
        return "the caller's"

    triton.set_allocator(callers)
    seen = {}

    def launch():
        buf = _allocation._allocator.get()(256, 128, None)
        seen["type"], seen["bytes"] = type(buf), buf.numel() * buf.element_size()
        return "launched"

    assert _bound._with_torch_scratch(torch.device("cpu"), launch) == "launched"
    assert seen == {"type": torch.Tensor, "bytes": 256}
    assert _allocation._allocator.get()(1, 1, None) == "the caller's"
