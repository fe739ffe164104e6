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
