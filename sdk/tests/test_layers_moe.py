"""`FusedMoE`: forward against a per-token float64 loop, routing chosen by its arguments,
a real ``register_oot`` replacement built in its place, its route in `binding_info`, and
tensor parallel over two gloo ranks matching one process."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opcore.distributed import check, run_ranks
from opcore.ir import ops
from opcore.layers import FusedMoE, binding_info

E, K, H, INTER, T = 8, 2, 24, 16, 7


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(E, 2 * INTER, H, generator=g) * H**-0.5,
        torch.randn(E, H, INTER, generator=g) * INTER**-0.5,
        torch.randn(T, H, generator=g),
        torch.randn(T, E, generator=g),
    )


def loop_moe(x, logits, w13, w2, k, renormalize):
    out = torch.zeros(x.shape, dtype=torch.float64)
    p = torch.softmax(logits.double(), -1)
    for t in range(x.shape[0]):
        order = sorted(range(E), key=lambda e: (-float(logits[t, e]), e))[:k]
        ws = [float(p[t, e]) for e in order]
        if renormalize:
            ws = [w / sum(ws) for w in ws]
        for e, w in zip(order, ws, strict=True):
            gu = w13[e].double() @ x[t].double()
            out[t] += w * (w2[e].double() @ (F.silu(gu[:INTER]) * gu[INTER:]))
    return out


@pytest.mark.parametrize("renormalize", [True, False])
def test_forward_matches_the_loop(renormalize):
    w13, w2, x, logits = _weights()
    moe = FusedMoE(E, K, H, INTER, renormalize=renormalize)
    moe.load_full_weights(w13, w2)
    assert moe.w13_weight.shape == (E, 2 * INTER, H) and moe.w2_weight.shape == (E, H, INTER)
    out = moe(x.reshape(1, T, H), logits.reshape(1, T, E))  # leading dims kept
    assert out.shape == (1, T, H)
    ref = loop_moe(x, logits, w13, w2, K, renormalize)
    torch.testing.assert_close(out.reshape(T, H).double(), ref, atol=2e-5, rtol=2e-5)


def test_grouped_routing_is_chosen_by_the_arguments():
    w13, w2, x, logits = _weights(1)
    moe = FusedMoE(
        E,
        K,
        H,
        INTER,
        use_grouped_topk=True,
        num_expert_group=4,
        topk_group=2,
        scoring_func="sigmoid",
        routed_scaling_factor=2.0,
        e_score_correction_bias=True,
    )
    moe.load_full_weights(w13, w2)
    with torch.no_grad():
        moe.e_score_correction_bias.copy_(torch.linspace(-0.5, 0.5, E))
    assert moe.routing_op == "grouped_topk"
    w, ids = ops.grouped_topk(logits, K, True, 4, 2, "sigmoid", 2.0, moe.e_score_correction_bias)
    want = ops.fused_experts(x, w13, w2, w, ids)
    assert torch.equal(moe(x, logits), want)
    plain = FusedMoE(E, K, H, INTER)
    plain.load_full_weights(w13, w2)
    assert plain.routing_op == "topk_softmax"
    assert not torch.equal(plain(x, logits), want)  # the routing really differs
    with pytest.raises(ValueError, match="use_grouped_topk"):
        FusedMoE(E, K, H, INTER, scoring_func="sigmoid")


@pytest.mark.parametrize("grouped", [False, True])
def test_forward_with_no_tokens_returns_an_empty_result(grouped):
    # reshaping the empty logits to [0, -1] raised (the -1 is ambiguous with 0 rows)
    w13, w2, _, _ = _weights()
    kw = dict(use_grouped_topk=True, num_expert_group=4, topk_group=2) if grouped else {}
    moe = FusedMoE(E, K, H, INTER, **kw)
    moe.load_full_weights(w13, w2)
    for lead in [(0,), (2, 0), (0, 3)]:
        out = moe(torch.randn(*lead, H), torch.randn(*lead, E))
        assert out.shape == (*lead, H) and out.dtype == torch.float32
    assert moe(torch.randn(2, 0, H), torch.randn(0, E)).shape == (2, 0, H)  # flat logits too


@pytest.mark.parametrize("shape", [(T, E - 2), (2 * T, E // 2), (T + 1, E), (1, T, E - 2)])
def test_forward_refuses_router_logits_of_another_shape(shape):
    # [T, E - 2] was routed over 6 experts and [2T, E / 2] reshaped into [T, E]: both
    # silently; now each is a ValueError naming router_logits
    w13, w2, x, logits = _weights()
    moe = FusedMoE(E, K, H, INTER)
    moe.load_full_weights(w13, w2)
    with pytest.raises(ValueError, match=r"FusedMoE: router_logits has shape"):
        moe(x, torch.randn(shape))
    # the shapes forward documents stay accepted: leading dims of hidden_states, or flat
    want = moe(x, logits)
    assert torch.equal(moe(x.reshape(1, T, H), logits.reshape(1, T, E)), want.reshape(1, T, H))
    assert torch.equal(moe(x.reshape(1, T, H), logits), want.reshape(1, T, H))


_GROUPED = dict(use_grouped_topk=True, num_expert_group=4, topk_group=2)


@pytest.mark.parametrize(
    "base,bad,name",
    [
        ({}, dict(num_experts=0), "num_experts"),  # was blamed on top_k
        ({}, dict(num_experts=True, top_k=1), "num_experts"),
        ({}, dict(top_k=True), "top_k"),
        ({}, dict(hidden_size=0), "hidden_size"),
        ({}, dict(hidden_size=2.5), "hidden_size"),  # was torch.empty's TypeError
        ({}, dict(intermediate_size=0), "intermediate_size"),
        # grouped settings that topk_softmax would ignore
        ({}, dict(num_expert_group=4), "num_expert_group"),
        ({}, dict(topk_group=2), "topk_group"),
        ({}, dict(routed_scaling_factor=2.0), "routed_scaling_factor"),
        # grouped settings that grouped_topk would refuse on every call
        (_GROUPED, dict(num_expert_group=0), "num_expert_group"),
        (_GROUPED, dict(num_expert_group=3), "num_expert_group"),  # does not divide 8
        (_GROUPED, dict(topk_group=True), "topk_group"),
        (_GROUPED, dict(topk_group=5), "topk_group"),  # more than the 4 groups
        (_GROUPED, dict(topk_group=1, top_k=3), "top_k"),  # one group holds 2 experts
        (_GROUPED, dict(scoring_func="relu"), "scoring_func"),
        (_GROUPED, dict(routed_scaling_factor=float("inf")), "routed_scaling_factor"),
        (_GROUPED, dict(routed_scaling_factor=float("nan")), "routed_scaling_factor"),
    ],
)
def test_constructor_refuses_invalid_or_ignored_settings_by_name(base, bad, name):
    # each was accepted (to fail in forward, or to be ignored by the router), failed in
    # torch.empty or was blamed on another argument
    args = {"num_experts": E, "top_k": K, "hidden_size": H, "intermediate_size": INTER, **base}
    FusedMoE(**args, e_score_correction_bias=None)  # builds without it (None: no bias)
    with pytest.raises(ValueError, match=rf"^FusedMoE: {name}\b"):
        FusedMoE(**{**args, **bad})


def test_register_oot_replaces_the_whole_layer_and_info_says_so():
    assert binding_info()["registry"]["fused_moe"]["route"] == (
        "forward -> op topk_softmax, grouped_topk, fused_experts (priority picks the kernel)"
    )

    class DenseMoE(FusedMoE):  # a different structure: every expert, softmax-weighted
        def forward(self, hidden_states, router_logits):
            p = torch.softmax(router_logits.float(), -1)
            gu = torch.einsum("eih,th->tei", self.w13_weight, hidden_states)
            h = F.silu(gu[..., : self.local_intermediate]) * gu[..., self.local_intermediate :]
            return torch.einsum("te,ehi,tei->th", p, self.w2_weight, h)

    FusedMoE.register_oot(DenseMoE)
    try:
        moe = FusedMoE(E, E, H, INTER, renormalize=False)
        assert type(moe) is DenseMoE
        w13, w2, x, logits = _weights(2)
        moe.load_full_weights(w13, w2)
        ref = loop_moe(x, logits, w13, w2, E, False)  # all experts: the two routes agree
        torch.testing.assert_close(moe(x, logits).double(), ref, atol=2e-5, rtol=2e-5)
        info = binding_info()
        assert info["registry"]["fused_moe"]["replacement"].endswith("DenseMoE")
        record = info["bindings"][f"{DenseMoE.__module__}.{DenseMoE.__qualname__}"]
        assert record["route"].startswith("register_oot: ")
        assert record["replaces"] == "opcore.layers.moe.FusedMoE"
    finally:
        FusedMoE.unregister_oot()
    assert type(FusedMoE(E, K, H, INTER)) is FusedMoE


def tp_moe(comm) -> dict:
    with torch.no_grad():
        w13, w2, x, logits = _weights(3)
        moe = FusedMoE(E, K, H, INTER, group="world")
        moe.load_full_weights(w13, w2)
        partial = FusedMoE(E, K, H, INTER, group="world", reduce_results=False)
        partial.load_full_weights(w13, w2)
        return {
            "out": moe(x, logits),
            "partial": partial(x, logits),
            "local": tuple(moe.w13_weight.shape),
        }


def test_tp2_matches_one_process():
    w13, w2, x, logits = _weights(3)
    with torch.no_grad():
        one = FusedMoE(E, K, H, INTER)
        one.load_full_weights(w13, w2)
        ref = one(x, logits)
    r0, r1 = check(run_ranks(tp_moe, 2, timeout_s=120, comm_timeout_s=30))
    assert r0["local"] == (E, INTER, H)  # each rank holds half of every expert's gate and up
    assert torch.equal(r0["out"], r1["out"])
    torch.testing.assert_close(r0["out"], ref, atol=2e-5, rtol=2e-5)
    assert not torch.allclose(r0["partial"], ref, atol=1e-3)  # a partial sum alone is not it
    torch.testing.assert_close(r0["partial"] + r1["partial"], ref, atol=2e-5, rtol=2e-5)
