"""Gated activations: `SiluAndMul`, `GeluAndMul`."""

from __future__ import annotations

import torch

from opcore.ir import ops
from opcore.layers.custom_op import CustomOp


@CustomOp.register("silu_and_mul")
class SiluAndMul(CustomOp):
    """``silu(x[..., :d]) * x[..., d:]`` with ``d = x.shape[-1] // 2``."""

    ir_ops = ("silu_and_mul",)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ops.silu_and_mul(x)


@CustomOp.register("gelu_and_mul")
class GeluAndMul(CustomOp):
    """``gelu(x[..., :d], approximate) * x[..., d:]``; ``approximate`` is ``"none"`` or
    ``"tanh"``."""

    ir_ops = ("gelu_and_mul",)

    def __init__(self, approximate: str = "none", *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        if approximate not in ("none", "tanh"):
            raise ValueError(
                f"GeluAndMul: approximate must be 'none' or 'tanh', got {approximate!r}"
            )
        self.approximate = approximate

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ops.gelu_and_mul(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"
