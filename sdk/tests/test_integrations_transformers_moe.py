"""`opcore.integrations.transformers.apply_moe` on real transformers Qwen3-MoE, Qwen2-MoE and
Mixtral classes (CPU, tiny random configs, no downloads): fp32 logits match the unpatched model,
greedy generation is token for token the same, the two ops really run (counting providers
put first), revert restores transformers' forward, and refusals change nothing."""

from __future__ import annotations

import contextlib

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import opcore.integrations.transformers as oh  # noqa: E402
from opcore.ir import ops  # noqa: E402
from opcore.testing.ir import temporary_impl  # noqa: E402

VOCAB = 128
COMMON = dict(
    num_hidden_layers=2,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
VARIANTS = {
    # Qwen3-MoE: shared-expert-free block, norm_topk_prob both ways, odd hidden size
    "qwen3moe-h72-e8-k2-norm": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=72, intermediate_size=96, moe_intermediate_size=40, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True)),
    "qwen3moe-h64-e16-k4-nonorm": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_experts=16,
        num_experts_per_tok=4, norm_topk_prob=False)),
    # Qwen2-MoE: a gated shared expert beside the routed ones
    "qwen2moe-h64-e8-k2-shared": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[])),
    "mixtral-h80-e8-k2": ("MixtralConfig", "MixtralForCausalLM", dict(
        hidden_size=80, intermediate_size=56, num_local_experts=8, num_experts_per_tok=2)),
}  # fmt: skip


def make_model(variant, dtype=torch.float32):
    config_cls, model_cls, opts = VARIANTS[variant]
    config = getattr(transformers, config_cls)(**COMMON, **opts)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(dtype).eval()
    with torch.no_grad():  # the init leaves the router at zero: give it real logits
        for name, p in model.named_parameters():
            if "mlp.gate.weight" in name or "expert" in name:
                p.normal_(0, 0.3)
    return model


def tokens(batch, seq, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (batch, seq), generator=g)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fp32_logits_match_and_greedy_tokens_identical(variant):
    model = make_model(variant)
    ids = tokens(2, 11)
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
    with torch.no_grad():
        ref = model(ids).logits
        want = model.generate(ids, **kw)
        with oh.apply_moe(model) as patch:
            assert len(patch.routes) == 2  # one sparse block per decoder layer
            got = model(ids).logits
            out = model.generate(ids, **kw)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
    assert float((ref - ref.mean()).abs().max()) > 0.1  # logits that say something
    assert torch.equal(out, want), (out, want)


_CALLS: dict[str, int] = {}


def _topk_softmax(gating_output, topk, renormalize):
    _CALLS["topk_softmax"] = _CALLS.get("topk_softmax", 0) + 1
    return ops.topk_softmax.native(gating_output, topk, renormalize)


def _fused_experts(
    hidden_states, w13, w2, topk_weights, topk_ids, activation="silu",
    apply_router_weight_on_input=False,
):  # fmt: skip
    _CALLS["fused_experts"] = _CALLS.get("fused_experts", 0) + 1
    return ops.fused_experts.native(
        hidden_states, w13, w2, topk_weights, topk_ids, activation, apply_router_weight_on_input
    )


@contextlib.contextmanager
def counting():
    _CALLS.clear()
    with contextlib.ExitStack() as stack:
        for op, fn in ((ops.topk_softmax, _topk_softmax), (ops.fused_experts, _fused_experts)):
            stack.enter_context(temporary_impl(op, "counting_test", fn))
            stack.enter_context(op.set_priority(["counting_test"]))
        yield _CALLS


def test_the_ops_run_and_revert_restores_transformers():
    model = make_model("mixtral-h80-e8-k2")
    ids = tokens(1, 5)
    block = model.model.layers[0].mlp
    experts = block.experts
    with torch.no_grad(), counting() as calls:
        patch = oh.apply_moe(model)
        model(ids)
        assert calls == {"topk_softmax": 2, "fused_experts": 2}
        patch.revert()
        calls.clear()
        model(ids)
        assert calls == {}
    assert "forward" not in block.__dict__ and not oh.is_patched(model)
    assert block.experts is experts  # the fused weights were used in place, not copied


def test_refusals_change_nothing():
    model = make_model("qwen3moe-h72-e8-k2-norm")
    model.config.output_router_logits = True
    with pytest.raises(oh.UnsupportedModelError, match="output_router_logits"):
        oh.apply_moe(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    model.config.output_router_logits = False
    model.config.hidden_act = "relu"
    with pytest.raises(oh.UnsupportedModelError, match="hidden_act='relu'"):
        oh.apply_moe(model)
    model.config.hidden_act = "silu"
    patch = oh.apply_moe(model)
    with pytest.raises(oh.UnsupportedModelError, match="already patched"):
        oh.apply_moe(model)
    patch.revert()
    dense = transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**COMMON, hidden_size=64, intermediate_size=96)
    )
    with pytest.raises(oh.UnsupportedModelError, match="model_type 'qwen3'"):
        oh.apply_moe(dense)


def whole_decoder_model(variant, **overrides):
    """``variant`` with config ``overrides`` and every parameter random (norm weights about
    1): the models the `apply` + `apply_moe` tests compare against."""
    config_cls, model_cls, opts = VARIANTS[variant]
    config = getattr(transformers, config_cls)(**{**COMMON, **opts, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.3)
    return model


GREEDY = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False)


def test_apply_takes_qwen3_moe_and_leaves_its_sparse_blocks_to_apply_moe():
    # Layer 0 dense (mlp_only_layers), layer 1 sparse: `apply` patches the attention,
    # norms and the dense MLP and leaves the sparse block; `apply_moe` patches that one.
    model = whole_decoder_model("qwen3moe-h72-e8-k2-norm", mlp_only_layers=[0])
    ids, kw = tokens(2, 11), GREEDY
    sparse = model.model.layers[1].mlp
    with torch.no_grad():
        ref = model(ids).logits
        want = model.generate(ids, **kw)
        with oh.patched(model) as patch, counting() as calls:
            assert patch.routes["sparse_mlp"].startswith("1 sparse MoE blocks")
            assert patch.routes["mlp"].startswith("1 MLPs")  # layer 0's dense MLP
            assert "split_qkv_rmsnorm_rope" in patch.routes["attention"]
            assert "forward" not in sparse.__dict__  # transformers' block, untouched
            torch.testing.assert_close(model(ids).logits, ref, atol=2e-5, rtol=2e-5)
            assert calls == {}
            with oh.apply_moe(model) as moe:
                assert list(moe.routes) == ["model.layers.1.mlp"]
                got = model(ids).logits
                assert calls == {"topk_softmax": 1, "fused_experts": 1}
                out = model.generate(ids, **kw)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
    assert torch.equal(out, want), (out, want)
    assert not oh.is_patched(model) and "forward" not in sparse.__dict__


def test_apply_takes_mixtral_whose_layers_are_all_sparse():
    # Mixtral has no dense MLP class: `apply` patches attention (with its sliding window),
    # norms and the fused add, and every layer's block is left to `apply_moe`.
    model = whole_decoder_model("mixtral-h80-e8-k2", sliding_window=6)
    ids, kw = tokens(2, 11), GREEDY  # longer than the window
    with torch.no_grad():
        ref = model(ids).logits
        want = model.generate(ids, **kw)
        with oh.patched(model) as patch:
            assert patch.routes["sparse_mlp"].startswith("2 sparse MoE blocks")
            assert "mlp" not in patch.routes and "rotary_embedding" in patch.routes["attention"]
            torch.testing.assert_close(model(ids).logits, ref, atol=2e-5, rtol=2e-5)
            with oh.apply_moe(model), counting() as calls:
                got = model(ids).logits
                assert calls == {"topk_softmax": 2, "fused_experts": 2}
                out = model.generate(ids, **kw)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
    assert torch.equal(out, want), (out, want)
    with pytest.raises(ValueError, match=r"ops \['silu_and_mul'\] do not apply to this mixtral"):
        oh.apply(model, ops=["rms_norm", "silu_and_mul"])
    model.model.layers[1].mlp = torch.nn.Identity()
    with pytest.raises(oh.UnsupportedModelError, match="not transformers' MixtralSparseMoeBlock"):
        oh.apply(model)
    assert not oh.is_patched(model)


@pytest.mark.parametrize("sliding", [False, True])
def test_apply_takes_qwen2_moe_with_its_shared_experts(sliding):
    # Layer 1 dense, layers 0 and 2 sparse with a shared expert each: `apply` patches the
    # dense MLP and both shared experts (Qwen2MoeMLP modules inside the blocks), the
    # attention (Qwen2-MoE's passes no sliding window: the model's mask carries it; with
    # use_sliding_window its first layer is a sliding one) and the norms.
    model = whole_decoder_model(
        "qwen2moe-h64-e8-k2-shared", num_hidden_layers=3, mlp_only_layers=[1],
        use_sliding_window=sliding, sliding_window=6, max_window_layers=1,
    )  # fmt: skip
    ids, kw = tokens(2, 11), GREEDY
    with torch.no_grad():
        ref = model(ids).logits
        want = model.generate(ids, **kw)
        with oh.patched(model) as patch, oh.apply_moe(model) as moe:
            assert patch.routes["mlp"].startswith("3 MLPs")  # the dense one, 2 shared experts
            assert patch.routes["sparse_mlp"].startswith("2 sparse MoE blocks")
            assert list(moe.routes) == ["model.layers.0.mlp", "model.layers.2.mlp"]
            got = model(ids).logits
            out = model.generate(ids, **kw)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
    assert torch.equal(out, want), (out, want)
