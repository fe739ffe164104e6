"""Tensor-parallel linear layers: `ColumnParallelLinear` and `RowParallelLinear`.

With ``tp`` ranks in group ``group`` (a name registered with `opcore.distributed`), a
decoder block splits its first projection by output columns and its second by input rows:

    x ──ColumnParallelLinear──► y_r = x @ W1[:, cols_r]      (no communication)
    y_r ─(local op: attention heads, SiLU-and-mul)─► z_r
    z_r ──RowParallelLinear───► sum_r z_r @ W2[rows_r, :]    (one all-reduce)

The all-reduce is the ``all_reduce`` op (its providers chosen by the platform's priority);
with ``reduce_results=False`` the row-parallel layer returns its partial sum, for the
caller to finish with ``fused_all_reduce_add_rms_norm``. With one rank no collective runs
(a sum over one rank is the tensor itself). Weights are held as each rank's shard;
`load_full_weight` takes the unsharded weight and keeps this rank's part.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from opcore.distributed.groups import get_communicator
from opcore.ir import ops


def _split(size: int, tp: int, what: str) -> int:
    if size % tp:
        raise ValueError(f"{what} = {size} is not divisible by the tensor-parallel size {tp}")
    return size // tp


class ColumnParallelLinear(nn.Module):
    """``y = x @ W.T (+ b)`` with ``W``'s output rows split across the ranks of ``group``.

    ``output_sizes`` splits a merged projection (QKV, gate/up) part by part, so each rank
    holds the same slice of every part: ``[q_r, k_r, v_r]``. Rank ``r``'s output is its
    slice (``out_features // tp`` columns); ``gather_output=True`` all-gathers the full
    output instead.

    Args:
        in_features: input features (not split).
        out_features: total output features, ``sum(output_sizes)``.
        group: registered process group name.
        output_sizes: the parts of a merged projection (default: one part).
        bias: add a bias (split like the output).
        gather_output: return the full output on every rank.
        dtype: parameter dtype.
        device: parameter device.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        group: str,
        output_sizes: Sequence[int] | None = None,
        bias: bool = False,
        gather_output: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        self.group = group
        comm = get_communicator(group)
        self.tp_size, self.tp_rank = comm.world_size, comm.rank
        sizes = list(output_sizes) if output_sizes is not None else [out_features]
        if sum(sizes) != out_features:
            raise ValueError(
                f"ColumnParallelLinear: output_sizes {sizes} sum to {sum(sizes)}, "
                f"not out_features = {out_features}"
            )
        self.output_sizes = sizes
        self.local_sizes = [_split(s, self.tp_size, "an output part") for s in sizes]
        self.in_features, self.out_features = in_features, out_features
        self.gather_output = gather_output
        local = sum(self.local_sizes)
        self.weight = nn.Parameter(torch.empty(local, in_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(local, dtype=dtype, device=device)) if bias else None

    def _shard(self, full: torch.Tensor) -> torch.Tensor:
        parts = full.split(self.output_sizes, dim=0)
        return torch.cat(
            [p.narrow(0, self.tp_rank * n, n) for p, n in zip(parts, self.local_sizes, strict=True)]
        )

    @torch.no_grad()
    def load_full_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Keep this rank's rows of the unsharded ``weight`` (``out_features x
        in_features``) and ``bias``."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"ColumnParallelLinear.load_full_weight: weight has shape "
                f"{tuple(weight.shape)}, expected ({self.out_features}, {self.in_features})"
            )
        self.weight.copy_(self._shard(weight))
        if self.bias is not None and bias is not None:
            self.bias.copy_(self._shard(bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output and self.tp_size > 1:
            gathered = get_communicator(self.group).all_gather(y, dim=-1)
            # rank-major blocks back into part-major order
            blocks = gathered.split(sum(self.local_sizes), dim=-1)
            parts = [b.split(self.local_sizes, dim=-1) for b in blocks]
            y = torch.cat(
                [parts[r][i] for i in range(len(self.local_sizes)) for r in range(self.tp_size)],
                dim=-1,
            )
        return y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"tp={self.tp_size}, rank={self.tp_rank}, group={self.group!r}"
        )


class RowParallelLinear(nn.Module):
    """``y = sum over ranks of x_r @ W[:, cols_r].T (+ b)``: ``W``'s input columns split
    across the ranks of ``group``; ``x_r`` is this rank's slice of the input (the output of
    a `ColumnParallelLinear` and a local op).

    ``reduce_results=True`` ends in the ``all_reduce`` op (every rank gets the full
    result); ``False`` returns this rank's partial product, for
    ``fused_all_reduce_add_rms_norm`` to reduce (a bias then is refused: it must be added
    once, after the sum).

    Args:
        in_features: total input features (split).
        out_features: output features (not split).
        group: registered process group name.
        bias: add a bias after the reduction.
        reduce_results: all-reduce the partial products.
        dtype: parameter dtype.
        device: parameter device.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        group: str,
        bias: bool = False,
        reduce_results: bool = True,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if bias and not reduce_results:
            raise ValueError(
                "RowParallelLinear: bias=True needs reduce_results=True (the bias is added "
                "once, after the all-reduce)"
            )
        self.group = group
        comm = get_communicator(group)
        self.tp_size, self.tp_rank = comm.world_size, comm.rank
        self.in_features, self.out_features = in_features, out_features
        self.local_in = _split(in_features, self.tp_size, "in_features")
        self.reduce_results = reduce_results
        self.weight = nn.Parameter(
            torch.empty(out_features, self.local_in, dtype=dtype, device=device)
        )
        self.bias = (
            nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None
        )

    @torch.no_grad()
    def load_full_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Keep this rank's columns of the unsharded ``weight`` (``out_features x
        in_features``); ``bias`` whole."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"RowParallelLinear.load_full_weight: weight has shape {tuple(weight.shape)}, "
                f"expected ({self.out_features}, {self.in_features})"
            )
        self.weight.copy_(weight.narrow(1, self.tp_rank * self.local_in, self.local_in))
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.reduce_results and self.tp_size > 1:
            # y is this call's own buffer: donated, so an in-place provider skips a copy
            y = ops.all_reduce.maybe_inplace(y, self.group)
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"tp={self.tp_size}, rank={self.tp_rank}, group={self.group!r}, "
            f"reduce_results={self.reduce_results}"
        )
