"""Mixture of experts: the routers ``topk_softmax`` and ``grouped_topk``, and ``fused_experts``.

**Routing** returns ``(topk_weights [T, k] float32, topk_ids [T, k] int32)``; row ``t``
lists token ``t``'s ``k`` experts in descending order of score.

- ``topk_softmax(gating_output [T, E], topk, renormalize)``: ``p = softmax(logits)`` over
  the experts in float32 (float64 for float64 logits); the ids are the ``topk`` largest
  ``p`` and the weights their ``p``, divided by their sum when ``renormalize``.
- ``grouped_topk(gating_output, topk, renormalize, num_expert_group, topk_group,
  scoring_func, routed_scaling_factor, e_score_correction_bias)``: DeepSeek-V3 routing.
  ``s = softmax(logits)`` or ``sigmoid(logits)``; the selection score is ``b = s + bias``
  (``b = s`` without a bias). The ``E`` experts form ``num_expert_group`` groups of
  consecutive ids; a group's score is the sum of its two largest ``b`` with a bias, its
  largest ``b`` without. The ``topk_group`` best groups are kept and the ids are the
  ``topk`` largest ``b`` among their experts (only theirs, even where their ``b`` is
  ``-inf``: a dropped group's expert is never chosen); the weights are ``s`` (never the bias) at
  those ids, divided by their sum when ``renormalize``, then times
  ``routed_scaling_factor``.

**The tie rule.** Order is by score, descending; equal scores go to the lower expert (or
group) id first, as a stable sort on ``(-score, id)`` gives. Without a bias softmax and
sigmoid are strictly increasing, so the order is decided on the logits themselves: an
``exp`` that rounds two different logits to one probability does not make a tie, and the
ids are the same in any precision. With a bias the order is that of ``s + b`` computed in
float32 (float64 for float64 logits). NaN logits give unspecified ids.

**fused_experts(hidden_states [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights [T, k],
topk_ids [T, k], activation, apply_router_weight_on_input)** returns ``[T, H]`` in
``hidden_states``' dtype::

    out[t] = sum_j  w[t, j] * W2[e] @ (act(g) * u),   [g | u] = W13[e] @ x[t],  e = ids[t, j]

(the gate is the first ``I`` rows of ``W13[e]``; ``act`` is ``silu`` or exact ``gelu``).
With ``apply_router_weight_on_input`` (top-1 models) the weight scales ``x[t]`` before the
experts instead. Everything is computed in float32 (float64 for float64 inputs) and rounded
once: the intermediate ``act(g) * u`` is not rounded to the input dtype. Ids must lie in
``[0, E)``: the validator checks them on CPU tensors only (on a device, reading them would
synchronise it on every call); an expert no token chose costs nothing.

**Tolerances.** The ids are integers and compared exactly. The routers' weights are
float32 softmax or sigmoid values: a kernel's ``exp`` may differ from torch's by a few
float32 ULPs, which `ROUTING_BUDGETS` allows (the H200's triton kernel measured 3 where
native measured 1). ``fused_experts``' fp16/bf16 budgets (`FUSED_EXPERTS_BUDGETS`) allow a
tensor-core kernel's other accumulation order while it keeps ``act(g) * u`` in float32;
rounding that intermediate to the input dtype does not fit them (5 to 21 ULPs measured in a
float64 simulation at I = 32 to 1408, where native measures 0.5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opcore.ir.op import register_op
from opcore.ir.ops import _checks as c
from opcore.ir.ops._moe_samples import experts_samples, grouped_samples, softmax_samples

ACTIVATIONS = ("silu", "gelu")
SCORING_FUNCS = ("softmax", "sigmoid")
_FLOAT = c.FLOAT_SET
_ID_SET = c.INDEX_SET
# (factor, floor ULPs): a tensor-core kernel's accumulation order, with the intermediate
# in float32, measures up to a few ULPs of the output where native (one rounding) is at 0.5.
FUSED_EXPERTS_BUDGETS = {torch.float16: (2.0, 4.0), torch.bfloat16: (2.0, 4.0)}
# The routers' float32 weights: another exp than torch's, a few float32 ULPs in any dtype.
ROUTING_BUDGETS = {dt: (4.0, 4.0) for dt in (torch.float32, torch.float16, torch.bfloat16)}
# The same rounding against the elementwise tolerance (outputs are O(1) by construction).
FUSED_EXPERTS_TOLERANCES = {torch.float16: (2e-3, 2e-3)}


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def descending_ids(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` largest along the last dim, descending, ties toward the lower index (a
    stable sort on ``(-score, index)``); int64."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def _finish(weights: torch.Tensor, ids: torch.Tensor, renormalize: bool, scale: float = 1.0):
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if scale != 1.0:
        weights = weights * scale
    return weights.to(torch.float32).contiguous(), ids.to(torch.int32).contiguous()


@register_op(activations=[], error_budgets=ROUTING_BUDGETS)
def topk_softmax(
    gating_output: torch.Tensor, topk: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``p = softmax(gating_output)`` in float32; ``(p[ids], ids)`` for the ``topk``
    largest, descending, ties toward the lower expert id; weights divided by their sum when
    ``renormalize``. Returns ``(topk_weights float32 [T, k], topk_ids int32 [T, k])``."""
    logits = gating_output.to(_acc(gating_output.dtype))
    ids = descending_ids(logits, topk)  # softmax is increasing: the order of the logits
    weights = torch.softmax(logits, dim=-1).gather(-1, ids)
    return _finish(weights, ids, renormalize)


@register_op(activations=[], error_budgets=ROUTING_BUDGETS)
def grouped_topk(
    gating_output: torch.Tensor,
    topk: int,
    renormalize: bool,
    num_expert_group: int,
    topk_group: int,
    scoring_func: str = "softmax",
    routed_scaling_factor: float = 1.0,
    e_score_correction_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing (module docstring): scores ``s`` (softmax or sigmoid), groups
    chosen on ``s + bias`` (top-2 sum with a bias, max without), ``topk`` experts among the
    ``topk_group`` best groups; weights ``s[ids]``, renormalized, times the scaling factor.
    """
    acc = _acc(gating_output.dtype)
    logits = gating_output.to(acc)
    if scoring_func == "softmax":
        scores = torch.softmax(logits, dim=-1)
    else:
        scores = torch.sigmoid(logits)
    tokens, experts = logits.shape
    per_group = experts // num_expert_group
    if e_score_correction_bias is None:
        select = logits  # both scorings are increasing: order by the logits
        group_scores = select.view(tokens, num_expert_group, per_group).amax(dim=-1)
    else:
        select = scores + e_score_correction_bias.to(acc)
        grouped = select.view(tokens, num_expert_group, per_group)
        group_scores = grouped.topk(min(2, per_group), dim=-1).values.sum(dim=-1)
    groups = descending_ids(group_scores, topk_group)
    # The top-k is taken among the kept groups' experts only, listed in increasing id order
    # (so the stable sort's ties still go to the lower id). Masking the dropped experts to
    # -inf instead would not exclude them: a kept expert may be -inf too, and a dropped one
    # of lower id would win the tie.
    first = groups.sort(dim=-1).values * per_group
    offsets = torch.arange(per_group, device=logits.device)
    kept = (first.unsqueeze(-1) + offsets).reshape(tokens, topk_group * per_group)
    ids = kept.gather(-1, descending_ids(select.gather(-1, kept), topk))
    return _finish(scores.gather(-1, ids), ids, renormalize, routed_scaling_factor)


def _act(name: str, g: torch.Tensor) -> torch.Tensor:
    return F.silu(g) if name == "silu" else F.gelu(g)


@register_op(
    activations=["hidden_states"],
    tolerances=FUSED_EXPERTS_TOLERANCES,
    error_budgets=FUSED_EXPERTS_BUDGETS,
)
def fused_experts(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * W2[e] @ (act(g) * u)`` with ``[g | u] = W13[e] @ x[t]``
    and ``e = topk_ids[t, j]``, in float32, rounded once to the hidden dtype."""
    acc = _acc(hidden_states.dtype)
    tokens, hidden = hidden_states.shape
    k = topk_ids.shape[1]
    inter = w2.shape[2]
    out = torch.zeros(tokens, hidden, dtype=acc, device=hidden_states.device)
    flat = topk_ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)  # the (token, slot) pairs grouped by expert
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    rows = order // k
    weights = topk_weights.reshape(-1).to(acc)[order].unsqueeze(1)
    x = hidden_states.to(acc)
    start = 0
    for e, n in enumerate(counts):
        if not n:
            continue
        t = rows[start : start + n]
        w = weights[start : start + n]
        start += n
        xe = x.index_select(0, t)
        if apply_router_weight_on_input:
            xe = xe * w
        gu = xe @ w13[e].to(acc).t()
        y = (_act(activation, gu[:, :inter]) * gu[:, inter:]) @ w2[e].to(acc).t()
        out.index_add_(0, t, y if apply_router_weight_on_input else y * w)
    return out.to(hidden_states.dtype)


# --------------------------------------------------------------------------- validators
def _int_ok(v) -> bool:
    return c.positive_int_ok(v)


def _bad_logits(op: str, g) -> None:
    if isinstance(g, torch.Tensor) and g.dtype in _FLOAT:
        c.fail(op, "gating_output", f"has shape {tuple(g.shape)}; expected [tokens, experts]")
    c.bad_float(op, "gating_output", g, min_dim=2, max_dim=2)


@topk_softmax.register_validator
def _validate_topk_softmax(gating_output, topk, renormalize):
    op = "topk_softmax"
    try:
        if gating_output.dtype not in _FLOAT or gating_output.ndim != 2:
            _bad_logits(op, gating_output)
    except AttributeError:
        c.required_tensors(op, gating_output=gating_output)
        raise
    if not (_int_ok(topk) and topk <= gating_output.shape[1]):
        c.bad_positive_int(op, "topk", topk, at_most=gating_output.shape[1], of="the experts")
    if type(renormalize) is not bool:
        c.bad_bool(op, "renormalize", renormalize)


@grouped_topk.register_validator
def _validate_grouped_topk(
    gating_output,
    topk,
    renormalize,
    num_expert_group,
    topk_group,
    scoring_func="softmax",
    routed_scaling_factor=1.0,
    e_score_correction_bias=None,
):
    op = "grouped_topk"
    try:
        if gating_output.dtype not in _FLOAT or gating_output.ndim != 2:
            _bad_logits(op, gating_output)
        experts = gating_output.shape[1]
        if e_score_correction_bias is not None and not (
            e_score_correction_bias.dtype in _FLOAT
            and e_score_correction_bias.shape == (experts,)
            and e_score_correction_bias.device == gating_output.device
        ):
            c.fail(
                op,
                "e_score_correction_bias",
                f"expected a float [{experts}] tensor on {gating_output.device}, got "
                f"{e_score_correction_bias.dtype} {tuple(e_score_correction_bias.shape)} on "
                f"{e_score_correction_bias.device}",
            )
    except AttributeError:
        c.required_tensors(op, gating_output=gating_output)
        c.not_tensors(op, e_score_correction_bias=e_score_correction_bias)
        raise
    if not (_int_ok(num_expert_group) and experts % num_expert_group == 0):
        if not _int_ok(num_expert_group):
            c.bad_positive_int(op, "num_expert_group", num_expert_group)
        c.fail(op, "num_expert_group", f"{num_expert_group} does not divide {experts} experts")
    if not (_int_ok(topk_group) and topk_group <= num_expert_group):
        c.bad_positive_int(
            op, "topk_group", topk_group, at_most=num_expert_group, of="num_expert_group"
        )
    allowed = topk_group * (experts // num_expert_group)
    if not (_int_ok(topk) and topk <= allowed):
        c.bad_positive_int(op, "topk", topk, at_most=allowed, of="the experts of topk_group groups")
    if type(renormalize) is not bool:
        c.bad_bool(op, "renormalize", renormalize)
    if scoring_func not in SCORING_FUNCS:
        c.fail(op, "scoring_func", f"is {scoring_func!r}; expected 'softmax' or 'sigmoid'")
    if not isinstance(routed_scaling_factor, (float, int, c.SymFloat)) or isinstance(
        routed_scaling_factor, bool
    ):
        c.wrong_type(op, "routed_scaling_factor", routed_scaling_factor, "a float")


@fused_experts.register_validator
def _validate_fused_experts(
    hidden_states,
    w13,
    w2,
    topk_weights,
    topk_ids,
    activation="silu",
    apply_router_weight_on_input=False,
):
    op = "fused_experts"
    try:
        x = hidden_states
        if x.dtype not in _FLOAT or x.ndim != 2:
            c.bad_float(op, "hidden_states", x, min_dim=2, max_dim=2)
        tokens, hidden = x.shape
        if not (w13.dtype is x.dtype and w13.ndim == 3 and w13.device == x.device):
            c.fail(op, "w13", _what(w13, f"{x.dtype} [experts, 2 * intermediate, {hidden}]"))
        experts, two_i = w13.shape[0], w13.shape[1]
        if two_i % 2 or w13.shape[2] != hidden:
            c.fail(op, "w13", _what(w13, f"[experts, 2 * intermediate, {hidden}]"))
        want = (experts, hidden, two_i // 2)
        if not (w2.dtype is x.dtype and w2.shape == want and w2.device == x.device):
            c.fail(op, "w2", _what(w2, f"{x.dtype} {list(want)} (w13 is {list(w13.shape)})"))
        if not (
            topk_ids.dtype in _ID_SET
            and topk_ids.ndim == 2
            and topk_ids.shape[0] == tokens
            and topk_ids.device == x.device
        ):
            c.fail(op, "topk_ids", _what(topk_ids, f"int32/int64 [{tokens}, k]"))
        if not (
            topk_weights.dtype in _FLOAT
            and topk_weights.shape == topk_ids.shape
            and topk_weights.device == x.device
        ):
            c.fail(op, "topk_weights", _what(topk_weights, f"float {list(topk_ids.shape)}"))
        # The ids' values only where reading them is free (a plain CPU tensor): on a device
        # it would synchronise every call, so GPU ids stay unchecked.
        c.check_index_values(op, "topk_ids", topk_ids, experts, f"the {experts} experts")
    except AttributeError:
        c.required_tensors(
            op,
            hidden_states=hidden_states,
            w13=w13,
            w2=w2,
            topk_weights=topk_weights,
            topk_ids=topk_ids,
        )
        raise
    if activation not in ACTIVATIONS:
        c.fail(op, "activation", f"is {activation!r}; expected 'silu' or 'gelu'")
    if type(apply_router_weight_on_input) is not bool:
        c.bad_bool(op, "apply_router_weight_on_input", apply_router_weight_on_input)
    if apply_router_weight_on_input and topk_ids.shape[1] != 1:
        c.fail(
            op,
            "apply_router_weight_on_input",
            f"needs top-1 routing (topk_ids has {topk_ids.shape[1]} columns): the weight "
            "scales the input of one expert",
        )


def _what(t: torch.Tensor, expected: str) -> str:
    return f"is {t.dtype} {list(t.shape)} on {t.device}; expected {expected} on one device"


# --------------------------------------------------------------------------- fakes
def _routing_fake(gating_output, topk):
    t = gating_output.shape[0]
    return (
        gating_output.new_empty((t, topk), dtype=torch.float32),
        gating_output.new_empty((t, topk), dtype=torch.int32),
    )


@topk_softmax.register_fake
def _topk_softmax_fake(gating_output, topk, renormalize):
    return _routing_fake(gating_output, topk)


@grouped_topk.register_fake
def _grouped_topk_fake(
    gating_output,
    topk,
    renormalize,
    num_expert_group,
    topk_group,
    scoring_func="softmax",
    routed_scaling_factor=1.0,
    e_score_correction_bias=None,
):
    return _routing_fake(gating_output, topk)


@fused_experts.register_fake
def _fused_experts_fake(
    hidden_states,
    w13,
    w2,
    topk_weights,
    topk_ids,
    activation="silu",
    apply_router_weight_on_input=False,
):
    return hidden_states.new_empty(hidden_states.shape)


topk_softmax.register_sample_inputs(softmax_samples)
grouped_topk.register_sample_inputs(grouped_samples)
fused_experts.register_sample_inputs(experts_samples)
