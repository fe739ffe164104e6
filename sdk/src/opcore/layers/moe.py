"""`FusedMoE`: a mixture-of-experts block's router and experts, as one replaceable layer.

    moe = FusedMoE(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768)
    out = moe(hidden_states, router_logits)        # [T, H], router_logits [T, E]

``forward`` routes with `opcore.ir.ops.topk_softmax`, or `grouped_topk` when
``use_grouped_topk=True`` (DeepSeek-V3: ``num_expert_group``, ``topk_group``,
``scoring_func``, ``routed_scaling_factor``, ``e_score_correction_bias=True`` for a learned
``[E]`` float32 bias), then runs `fused_experts`; each op's kernel comes from the platform's
provider priority. The router's linear layer stays with the model (it may be replicated or
sharded differently), so ``forward`` takes its logits.

Parameters: ``w13_weight [E, 2 * I_local, H]`` (gate rows first, then up rows) and
``w2_weight [E, H, I_local]``.

**Tensor parallel.** With ``group=`` a registered process group of ``tp`` ranks, each rank
holds every expert's slice ``I / tp`` of the intermediate dimension (the gate and the up
half sliced alike, like a `ColumnParallelLinear` with two output parts), so
``I_local = I / tp``; its `fused_experts` result is a partial sum over the intermediate
dimension and ``forward`` ends in the ``all_reduce`` op (``reduce_results=False`` returns
the partial sum instead). Routing is computed on every rank from the same logits, so the
ranks agree on the experts. `load_full_weights` takes the unsharded weights and keeps this
rank's slices. Expert parallelism (experts split across ranks) is not implemented.

It is a `PluggableLayer` registered as ``"fused_moe"``: a plugin replaces the whole module
with ``FusedMoE.register_oot`` (as vllm-ascend registers its own ``FusedMoE``); to change
only the kernels, register providers of the three ops instead.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn as nn

from opcore.ir import ops
from opcore.layers.custom_op import PluggableLayer


def _positive_int(name: str, v: object) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"FusedMoE: {name} must be a positive int, got {v!r}")


def _check_config(
    num_experts, top_k, hidden_size, intermediate_size, activation, use_grouped_topk,
    num_expert_group, topk_group, scoring_func, routed_scaling_factor, e_score_correction_bias,
) -> None:  # fmt: skip
    """Refuse at construction what `forward` would refuse on every call, and settings a
    router would ignore (a user who passes ``topk_group`` without ``use_grouped_topk``
    expects it to act)."""
    _positive_int("num_experts", num_experts)
    _positive_int("top_k", top_k)
    _positive_int("hidden_size", hidden_size)
    _positive_int("intermediate_size", intermediate_size)
    if activation not in ("silu", "gelu"):
        raise ValueError(f"FusedMoE: activation must be 'silu' or 'gelu', got {activation!r}")
    if top_k > num_experts:
        raise ValueError(f"FusedMoE: top_k = {top_k} must be in [1, {num_experts}]")
    if not use_grouped_topk:
        given = [
            name
            for name, v, default in (
                ("num_expert_group", num_expert_group, None),
                ("topk_group", topk_group, None),
                ("scoring_func", scoring_func, "softmax"),
                ("routed_scaling_factor", routed_scaling_factor, 1.0),
                # a flag: None (as a vllm-style call passes for no bias) is off, as False
                ("e_score_correction_bias", bool(e_score_correction_bias), False),
            )
            if v != default
        ]
        if given:
            raise ValueError(
                f"FusedMoE: {', '.join(given)} need use_grouped_topk=True (topk_softmax scores "
                "with softmax over all experts, with no groups, bias or scaling)"
            )
        return
    if num_expert_group is None or topk_group is None:
        raise ValueError("FusedMoE: use_grouped_topk needs num_expert_group and topk_group")
    _positive_int("num_expert_group", num_expert_group)
    _positive_int("topk_group", topk_group)
    if num_experts % num_expert_group:
        raise ValueError(
            f"FusedMoE: num_expert_group = {num_expert_group} does not divide "
            f"num_experts = {num_experts}"
        )
    if topk_group > num_expert_group:
        raise ValueError(
            f"FusedMoE: topk_group = {topk_group} must be at most num_expert_group = "
            f"{num_expert_group}"
        )
    kept = topk_group * (num_experts // num_expert_group)
    if top_k > kept:
        raise ValueError(
            f"FusedMoE: top_k = {top_k} exceeds the {kept} experts of the {topk_group} kept groups"
        )
    if scoring_func not in ("softmax", "sigmoid"):
        raise ValueError(
            f"FusedMoE: scoring_func must be 'softmax' or 'sigmoid', got {scoring_func!r}"
        )
    if (
        not isinstance(routed_scaling_factor, (int, float))
        or isinstance(routed_scaling_factor, bool)
        or not math.isfinite(routed_scaling_factor)
        or routed_scaling_factor <= 0
    ):
        raise ValueError(
            "FusedMoE: routed_scaling_factor must be a positive finite number, got "
            f"{routed_scaling_factor!r}"
        )


@PluggableLayer.register("fused_moe")
class FusedMoE(PluggableLayer):
    """Router (``topk_softmax`` or ``grouped_topk``) + ``fused_experts`` (module docstring).

    Args:
        num_experts: ``E``.
        top_k: experts per token.
        hidden_size: ``H``.
        intermediate_size: each expert's full ``I`` (before tensor-parallel sharding).
        renormalize: divide the chosen weights by their sum.
        activation: ``"silu"`` or ``"gelu"``.
        use_grouped_topk: route with ``grouped_topk``.
        num_expert_group: groups for ``grouped_topk``.
        topk_group: groups kept for ``grouped_topk``.
        scoring_func: ``"softmax"`` or ``"sigmoid"`` (``grouped_topk``).
        routed_scaling_factor: multiplies the weights (``grouped_topk``).
        e_score_correction_bias: hold a learned ``[E]`` selection bias (``grouped_topk``).
        apply_router_weight_on_input: scale the input instead of the output (top-1).
        group: registered process group to shard the intermediate dimension over.
        reduce_results: all-reduce the partial sums (only with ``group``).
        dtype: parameter dtype.
        device: parameter device.
    """

    ir_ops: ClassVar[tuple[str, ...]] = ("topk_softmax", "grouped_topk", "fused_experts")

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool = True,
        activation: str = "silu",
        *,
        use_grouped_topk: bool = False,
        num_expert_group: int | None = None,
        topk_group: int | None = None,
        scoring_func: str = "softmax",
        routed_scaling_factor: float = 1.0,
        e_score_correction_bias: bool = False,
        apply_router_weight_on_input: bool = False,
        group: str | None = None,
        reduce_results: bool = True,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        _check_config(
            num_experts, top_k, hidden_size, intermediate_size, activation, use_grouped_topk,
            num_expert_group, topk_group, scoring_func, routed_scaling_factor,
            e_score_correction_bias,
        )  # fmt: skip
        self.num_experts, self.top_k = num_experts, top_k
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.renormalize, self.activation = renormalize, activation
        self.use_grouped_topk = use_grouped_topk
        self.num_expert_group, self.topk_group = num_expert_group, topk_group
        self.scoring_func, self.routed_scaling_factor = scoring_func, float(routed_scaling_factor)
        self.apply_router_weight_on_input = apply_router_weight_on_input
        self.group, self.reduce_results = group, reduce_results
        self.tp_size, self.tp_rank = 1, 0
        if group is not None:
            from opcore.distributed.groups import get_communicator

            comm = get_communicator(group)
            self.tp_size, self.tp_rank = comm.world_size, comm.rank
        if intermediate_size % self.tp_size:
            raise ValueError(
                f"FusedMoE: intermediate_size = {intermediate_size} is not divisible by the "
                f"tensor-parallel size {self.tp_size}"
            )
        self.local_intermediate = intermediate_size // self.tp_size
        i = self.local_intermediate
        self.w13_weight = nn.Parameter(
            torch.empty(num_experts, 2 * i, hidden_size, dtype=dtype, device=device)
        )
        self.w2_weight = nn.Parameter(
            torch.empty(num_experts, hidden_size, i, dtype=dtype, device=device)
        )
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(num_experts, dtype=torch.float32, device=device))
            if e_score_correction_bias
            else None
        )

    @property
    def routing_op(self) -> str:
        return "grouped_topk" if self.use_grouped_topk else "topk_softmax"

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(topk_weights, topk_ids)`` for ``router_logits [T, E]``."""
        if not self.use_grouped_topk:
            return ops.topk_softmax(router_logits, self.top_k, self.renormalize)
        return ops.grouped_topk(
            router_logits,
            self.top_k,
            self.renormalize,
            self.num_expert_group,
            self.topk_group,
            self.scoring_func,
            self.routed_scaling_factor,
            self.e_score_correction_bias,
        )

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """``hidden_states [..., H]`` and ``router_logits [..., E]`` with the same leading
        dims (any number of tokens, none included) to ``[..., H]``."""
        shape = hidden_states.shape
        tokens = shape[:-1].numel()
        e = self.num_experts
        if router_logits.shape != (*shape[:-1], e) and router_logits.shape != (tokens, e):
            raise ValueError(
                f"FusedMoE: router_logits has shape {tuple(router_logits.shape)}; expected "
                f"{(*shape[:-1], e)} or {(tokens, e)} for hidden_states "
                f"{tuple(shape)} and {e} experts"
            )
        x = hidden_states.reshape(tokens, shape[-1])
        weights, ids = self.route(router_logits.reshape(tokens, e))
        y = ops.fused_experts(
            x,
            self.w13_weight,
            self.w2_weight,
            weights,
            ids,
            self.activation,
            self.apply_router_weight_on_input,
        )
        if self.tp_size > 1 and self.reduce_results:
            # y is this call's own buffer: donated to an in-place provider
            y = ops.all_reduce.maybe_inplace(y, self.group)
        return y.reshape(shape)

    @torch.no_grad()
    def load_full_weights(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        """Keep this rank's intermediate slices of the unsharded ``w13 [E, 2I, H]`` (gate
        rows, then up rows) and ``w2 [E, H, I]``."""
        e, i, h = self.num_experts, self.intermediate_size, self.hidden_size
        if tuple(w13.shape) != (e, 2 * i, h) or tuple(w2.shape) != (e, h, i):
            raise ValueError(
                f"FusedMoE.load_full_weights: w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)}, "
                f"expected ({e}, {2 * i}, {h}) and ({e}, {h}, {i})"
            )
        n, start = self.local_intermediate, self.tp_rank * self.local_intermediate
        gate, up = w13[:, :i], w13[:, i:]
        self.w13_weight.copy_(torch.cat([gate[:, start : start + n], up[:, start : start + n]], 1))
        self.w2_weight.copy_(w2[:, :, start : start + n])

    def extra_repr(self) -> str:
        tp = f", tp={self.tp_size}, rank={self.tp_rank}, group={self.group!r}" if self.group else ""
        return (
            f"num_experts={self.num_experts}, top_k={self.top_k}, hidden={self.hidden_size}, "
            f"intermediate={self.intermediate_size}, routing={self.routing_op}, "
            f"activation={self.activation!r}{tp}"
        )
