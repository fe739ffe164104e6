"""`RMSNorm`: RMS normalization, optionally fused with a residual add."""

from __future__ import annotations

import torch
import torch.nn as nn

from opcore.ir import ops
from opcore.layers.custom_op import CustomOp


@CustomOp.register("rms_norm")
class RMSNorm(CustomOp):
    """``forward(x)`` -> ``rms_norm(x)``; ``forward(x, residual)`` -> ``(rms_norm(x +
    residual), x + residual)``. Neither form mutates its inputs.

    ``var_hidden_size``: normalize by the mean square of the first ``var_hidden_size``
    features only. ``has_weight=False``: no learned scale."""

    ir_ops = ("rms_norm", "fused_add_rms_norm")

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        var_hidden_size: int | None = None,
        has_weight: bool = True,
        dtype: torch.dtype | None = None,
        *,
        enforce_enable: bool = False,
    ):
        super().__init__(enforce_enable=enforce_enable)
        self.hidden_size = hidden_size
        self.variance_epsilon = float(eps)
        self.variance_size_override = (
            None if var_hidden_size in (None, hidden_size) else var_hidden_size
        )
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype)) if has_weight else None

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return ops.rms_norm(x, self.weight, self.variance_epsilon, self.variance_size_override)
        return ops.fused_add_rms_norm(
            x, residual, self.weight, self.variance_epsilon, self.variance_size_override
        )

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.variance_epsilon}"
