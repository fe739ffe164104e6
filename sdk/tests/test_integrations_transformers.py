"""opcore.integrations.transformers on real transformers model classes (CPU, no downloads).

Tiny random-weight Llama, Mistral, Qwen2 and Qwen3 models are built from their config
classes with odd sizes (hidden 96 / 136 / 200, head_dim 32 / 64 / 128, GQA ratios 1, 2, 4,
8, tied embeddings, biases, llama3 and yarn rope scaling, a sliding window, gelu-tanh).
The patched model is compared with the same model unpatched: fp32 logits to rounding,
bf16 logits within the distance bf16 itself puts between the unpatched model and its fp32
run, greedy generation token for token. Then: revert, refusals that leave the model
untouched, the ops really being called, autograd, class-level patching, torch.compile, and
(in a child under ``TRITON_INTERPRET=1``) the ``triton`` provider first, and (in a child
with ``OPCORE_VDEV=1``) the patched model on the virtual device.

Partial rotary: none of these four architectures computes it (their cos/sin span the whole
head), so a config asking for it is refused; the op's partial rotary is covered by the op
tests. On the virtual device greedy decoding runs as a plain loop: ``generate`` itself
calls ``aten::isin``, which the virtual device does not implement.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys

import pytest
import torch

from opcore.testing.interpreter import UNDER_TRITON_INTERPRETER, rerun_under_triton_interpreter

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'opcore[transformers]')"
)

import opcore.integrations.transformers as oh  # noqa: E402
from opcore.integrations.transformers import _fuse, _versions  # noqa: E402

_arch = sys.modules["opcore.integrations.transformers._arch"]  # the package's _arch is a function
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
)

# id -> (config class, model class, options)
VARIANTS = {
    "llama-h96-d64-gqa1-tied": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=96, intermediate_size=160, num_attention_heads=4, num_key_value_heads=4,
        head_dim=64, tie_word_embeddings=True)),
    "llama-h72-d32-gelutanh-llama3rope-bias": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=72, intermediate_size=100, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, hidden_act="gelu_pytorch_tanh", mlp_bias=True, attention_bias=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32})),
    "mistral-h200-d64-gqa8-window16": ("MistralConfig", "MistralForCausalLM", dict(
        hidden_size=200, intermediate_size=96, num_attention_heads=8, num_key_value_heads=1,
        head_dim=64, sliding_window=16)),
    "qwen2-h136-d128-gqa4-bias-yarn": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=136, intermediate_size=120, num_attention_heads=4, num_key_value_heads=1,
        head_dim=128,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 32})),
    "qwen3-h96-d128-gqa2-tied": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=96, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
        head_dim=128, tie_word_embeddings=True)),
    "qwen3-h120-d64-gqa4": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=120, intermediate_size=88, num_attention_heads=8, num_key_value_heads=2,
        head_dim=64, tie_word_embeddings=False)),
}  # fmt: skip


def make_config(variant: str, **overrides):
    config_name, _, opts = VARIANTS[variant]
    return getattr(transformers, config_name)(**{**COMMON, **opts, **overrides})


def make_model(variant: str, dtype=torch.float32, seed: int = 0, **overrides):
    """The variant with random weights large enough that every path moves the logits
    (transformers' init leaves norms at 1 and biases at 0)."""
    _, model_name, _ = VARIANTS[variant]
    config = make_config(variant, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                base = 1.0 if "norm" in name else 0.0
                p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(
                    torch.randn(p.shape, generator=g)
                    * (1.0 if "embed" in name else p.shape[1] ** -0.5)
                )
    return model.to(dtype)


def tokens(batch: int = 2, length: int = 11, seed: int = 1):
    return torch.randint(2, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_fp32_close(got, ref):
    """fp32 logits equal to rounding: the ops round once, transformers' fp32 code too, but
    fused GEMMs and compiled graphs may sum in another order."""
    torch.testing.assert_close(got, ref, atol=2e-5 * max(1.0, float(ref.abs().max())), rtol=1e-5)


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits.float()


def snapshot(model):
    """What 'untouched' means: every module's class and attribute names, every parameter's
    object, storage and value, the buffers."""
    return {
        "classes": [(n, type(m), sorted(m.__dict__)) for n, m in model.named_modules()],
        "params": [
            (n, id(p), p.data_ptr(), p.detach().clone()) for n, p in model.named_parameters()
        ],
        "buffers": sorted(n for n, _ in model.named_buffers()),
    }


def assert_same_snapshot(a, b):
    assert a["classes"] == b["classes"]
    assert a["buffers"] == b["buffers"]
    for (n1, i1, d1, v1), (n2, i2, d2, v2) in zip(a["params"], b["params"], strict=True):
        assert (n1, i1, d1) == (n2, i2, d2), n1
        assert torch.equal(v1, v2), n1


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models: intra-op threads only add synchronization, and on a loaded 2-core CI
    # machine they turned a 0.25 s generate into 20 s.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


ON_VDEV = os.environ.get("OPCORE_VDEV") == "1"
LIGER_REBINDS = ("LlamaRMSNorm", "LlamaMLP", "apply_rotary_pos_emb")


@pytest.fixture
def liger(monkeypatch):
    """``liger_kernel.transformers``, Liger's own functions. It has no revert: the names its
    ``apply_liger_kernel_to_llama`` rebinds in ``modeling_llama`` are put back after the
    test (call it with ``model=``, so that it changes no class)."""
    lk = pytest.importorskip("liger_kernel.transformers", reason="liger-kernel is not installed")
    ml = transformers.models.llama.modeling_llama
    for name in LIGER_REBINDS:
        monkeypatch.setattr(ml, name, getattr(ml, name))  # restored at teardown
    return lk


def autograd_nodes(t: torch.Tensor) -> set[str]:
    """The names of every autograd node ``t`` was computed through."""
    seen, todo, names = set(), [t.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo.extend(n for n, _ in node.next_functions)
    return names


def greedy_tokens(model, ids, steps: int, device) -> torch.Tensor:
    """Greedy decoding as a plain loop over a DynamicCache (what ``generate`` does for
    these inputs, without its extra ops)."""
    cache = transformers.DynamicCache(config=model.config)
    ids = ids.to(device)
    out = ids
    with torch.no_grad():
        logits = model(ids, past_key_values=cache, use_cache=True).logits
        for _ in range(steps):
            nxt = logits[:, -1:].argmax(-1)
            out = torch.cat((out, nxt), dim=1)
            logits = model(nxt, past_key_values=cache, use_cache=True).logits
    return out.cpu()


if ON_VDEV:
    from opcore.platforms import current_platform

    @pytest.mark.parametrize("variant", list(VARIANTS))
    def test_on_the_virtual_device(variant):
        assert current_platform.name == "vdev"
        ids = tokens()
        ref = logits(make_model(variant), ids)
        model = make_model(variant).to("vdev")
        with oh.patched(model):
            got = logits(model, ids.to("vdev"))
            assert got.device.type == "vdev"
            assert_fp32_close(got.cpu(), ref)
            tokens_vdev = greedy_tokens(model, ids, 32, "vdev")
        assert torch.equal(tokens_vdev, greedy_tokens(make_model(variant), ids, 32, "cpu"))
        # bf16 within bf16 rounding of the unpatched CPU model
        ref16 = logits(make_model(variant, torch.bfloat16), ids)
        noise = float((ref16 - ref).abs().max())
        model16 = make_model(variant, torch.bfloat16).to("vdev")
        with oh.patched(model16):
            got16 = logits(model16, ids.to("vdev")).cpu()
        assert float((got16 - ref16).abs().max()) <= 2 * noise + 1e-3

elif not UNDER_TRITON_INTERPRETER:

    @pytest.mark.parametrize("variant", list(VARIANTS))
    def test_fp32_logits_match_unpatched(variant):
        model = make_model(variant)
        ids = tokens()
        ref = logits(model, ids)
        with oh.patched(model) as patch:
            assert "attention" in patch.routes and "mlp" in patch.routes, patch
            got = logits(model, ids)
        assert float(ref.abs().max()) > 1.0  # the random weights make the logits move
        assert_fp32_close(got, ref)

    @pytest.mark.parametrize("variant", list(VARIANTS))
    def test_bf16_logits_within_bf16_rounding_of_unpatched(variant):
        # The ops compute in fp32 and round once; transformers rounds to bf16 in between.
        # So the patched model must be as close to the unpatched one as bf16 rounding
        # moves the unpatched model itself away from its fp32 run.
        ids = tokens()
        ref32 = logits(make_model(variant), ids)
        model = make_model(variant, torch.bfloat16)
        ref = logits(model, ids)
        noise = float((ref - ref32).abs().max())
        with oh.patched(model):
            got = logits(model, ids)
        diff = float((got - ref).abs().max())
        own = float((got - ref32).abs().max())
        assert diff <= 2 * noise + 1e-3, f"patched vs unpatched bf16 {diff}, bf16 noise {noise}"
        assert own <= 2 * noise + 1e-3, f"patched bf16 vs fp32 {own}, bf16 noise {noise}"

    @pytest.mark.parametrize("variant", list(VARIANTS))
    def test_greedy_generate_32_tokens_identical_fp32(variant):
        model = make_model(variant)
        ids = tokens(2, 9)
        mask = torch.ones_like(ids)
        ids[0, :3], mask[0, :3] = 0, 0  # left padding: positions differ per row
        kw = dict(attention_mask=mask, max_new_tokens=32, min_new_tokens=32, do_sample=False)
        with torch.no_grad():
            want = model.generate(ids, **kw)
            with oh.patched(model):
                got = model.generate(ids, **kw)
        assert want.shape == (2, 9 + 32)
        assert torch.equal(got, want), (got, want)

    def test_positions_reach_the_ops_contiguous_one_per_token():
        # A decode step's position_ids expanded to the batch flatten to a stride-0 view;
        # the Triton kernels read positions as contiguous, so on the H200 such a step read
        # past the tensor (illegal memory access). The patched rotary hands the layers
        # contiguous positions of the hidden states' [batch, seq] shape.
        model = make_model("qwen3-h96-d128-gqa2-tied")
        x = torch.zeros(4, 1, 96)
        with oh.patched(model):
            for pos in (
                torch.tensor([[7]]).expand(4, -1),
                torch.tensor([[7]]),
                torch.arange(4)[:, None],
            ):
                cache, positions = model.model.rotary_emb(x, pos)
                assert positions.shape == (4, 1) and positions.is_contiguous(), pos.stride()
                assert positions.reshape(-1).stride() == (1,)
                assert torch.equal(positions, pos.expand(4, 1))
            assert cache.shape == (128, 128) and cache.dtype == torch.float32

    def test_revert_restores_classes_buffers_and_exact_logits():
        model = make_model("qwen3-h96-d128-gqa2-tied")
        ids = tokens()
        before = snapshot(model)
        ref = logits(model, ids)
        patch = oh.apply(model)
        assert oh.is_patched(model)
        assert type(model.model.layers[0].self_attn).__name__ == "OpcoreQwen3Attention"
        assert isinstance(
            model.model.layers[0].self_attn, transformers.models.qwen3.modeling_qwen3.Qwen3Attention
        )
        # parameters keep their objects and names; the state dict is unchanged
        assert [n for n, _ in model.named_parameters()] == [p[0] for p in before["params"]]
        oh.revert(model)
        assert not patch.active and not oh.is_patched(model)
        after = snapshot(model)
        assert after["classes"] == before["classes"] and after["buffers"] == before["buffers"]
        for (n, i, _, v), (_, i2, _, v2) in zip(before["params"], after["params"], strict=True):
            assert i == i2 and torch.equal(v, v2), n
        assert torch.equal(logits(model, ids), ref)
        with pytest.raises(ValueError, match="is not patched"):
            oh.revert(model)

    def test_state_dict_unchanged_while_patched():
        model = make_model("llama-h72-d32-gelutanh-llama3rope-bias")
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        with oh.patched(model):
            sd2 = model.state_dict()
            assert list(sd2) == list(sd)
            assert all(torch.equal(sd[k], sd2[k]) for k in sd)

    @pytest.mark.parametrize(
        "overrides, named",
        [
            (dict(hidden_act="relu"), "hidden_act='relu'"),
            (
                dict(
                    rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
                ),
                "rope_type='dynamic'",
            ),
            (
                dict(
                    rope_parameters={
                        "rope_type": "default",
                        "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.5,
                    }
                ),
                "partial_rotary_factor=0.5",
            ),
        ],
        ids=["relu", "dynamic-rope", "partial-rotary"],
    )
    def test_unsupported_config_is_refused_and_model_untouched(overrides, named):
        model = make_model("llama-h96-d64-gqa1-tied", **overrides)
        before = snapshot(model)
        with pytest.raises(oh.UnsupportedModelError, match="nothing was changed") as err:
            oh.apply(model)
        assert named in str(err.value)
        assert_same_snapshot(before, snapshot(model))
        assert not oh.is_patched(model)

    @pytest.mark.parametrize("variant", ["llama-h96-d64-gqa1-tied", "qwen3-h120-d64-gqa4"])
    def test_partial_rotary_has_no_reference_in_these_classes(variant):
        # Why a partial_rotary_factor is refused rather than reproduced: these transformers
        # classes have no partial rotary to match. The default rope type ignores the factor
        # (rotates the whole head); a scaled type shrinks cos/sin, which the unpatched
        # attention then cannot apply. Should a transformers release rotate part of the head,
        # this fails and the refusal should become a route.
        def rope(rope_type, **extra):
            return {"rope_type": rope_type, "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                    **extra}  # fmt: skip

        head_dim = VARIANTS[variant][2]["head_dim"]
        model = make_model(variant, rope_parameters=rope("default"))
        assert 2 * model.model.rotary_emb.inv_freq.numel() == head_dim
        ids = tokens()
        assert torch.equal(logits(model, ids), logits(make_model(variant), ids))
        model = make_model(variant, rope_parameters=rope("linear", factor=2.0))
        assert 2 * model.model.rotary_emb.inv_freq.numel() == head_dim // 2
        with pytest.raises(RuntimeError, match="size of tensor"):
            logits(model, ids)
        for rope_type, extra in (("default", {}), ("linear", {"factor": 2.0})):
            with pytest.raises(oh.UnsupportedModelError, match="partial_rotary_factor=0.5"):
                oh.apply(make_model(variant, rope_parameters=rope(rope_type, **extra)))

    def test_unsupported_model_class_is_refused():
        cfg = transformers.GPT2Config(
            n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32
        )
        model = transformers.GPT2LMHeadModel(cfg).eval()
        before = snapshot(model)
        with pytest.raises(
            oh.UnsupportedModelError,
            match=r"GPT2LMHeadModel \(model_type 'gpt2'\) is not supported",
        ):
            oh.apply(model)
        assert_same_snapshot(before, snapshot(model))
        with pytest.raises(oh.UnsupportedModelError, match="is a qwen3 model, not llama"):
            oh.apply_to_llama(make_model("qwen3-h96-d128-gqa2-tied"))

    def test_subclassed_module_and_instance_forward_are_refused():
        model = make_model("qwen3-h120-d64-gqa4")
        mlp = model.model.layers[1].mlp

        class MyMLP(type(mlp)):
            pass

        mlp.__class__ = MyMLP
        model.model.layers[0].input_layernorm.forward = lambda x: x  # an accelerate-style hook
        before = snapshot(model)
        with pytest.raises(oh.UnsupportedModelError) as err:
            oh.apply(model)
        msg = str(err.value)
        assert "model.layers.1.mlp: " in msg and "subclasses the MLP class" in msg
        assert "model.layers.0.input_layernorm" in msg and "instance-level forward" in msg
        assert_same_snapshot(before, snapshot(model))

    def test_beside_liger_each_model_computes_its_own(liger):
        # Liger's apply_liger_kernel_to_llama(model=theirs) points theirs' modules at Liger's
        # forwards and rebinds modeling_llama.LlamaRMSNorm, LlamaMLP and apply_rotary_pos_emb
        # for everyone. opcore kept transformers' classes and functions at import: models of
        # them are still patched (whole, or per ops=), and compute opcore's results. On the
        # CPU Liger's Triton kernels cannot run (no driver), so a forward that reached one
        # raises: theirs does, the opcore models do not.
        variant = "llama-h96-d64-gqa1-tied"
        ml = transformers.models.llama.modeling_llama
        ids = tokens()
        ref = logits(make_model(variant), ids)
        early = make_model(variant)
        oh.apply(early)  # patched before the rebinding
        theirs, ours, partial = make_model(variant), make_model(variant), make_model(variant)
        liger.apply_liger_kernel_to_llama(model=theirs)
        assert ml.LlamaRMSNorm is liger.LigerRMSNorm and ml.LlamaMLP is liger.LigerSwiGLUMLP
        assert ml.apply_rotary_pos_emb is liger.liger_rotary_pos_emb
        assert theirs.model.norm.forward.__func__ is liger.LigerRMSNorm.forward
        assert theirs.model.layers[0].mlp.forward.__func__ is liger.LigerSwiGLUMLP.forward
        with pytest.raises(RuntimeError, match="active drivers"):
            logits(theirs, ids)  # Liger's Triton kernels: a GPU's
        sub = oh.apply(partial, ops=["rms_norm", "silu_and_mul"])
        assert sub.routes["rms_norm"] == "5 RMSNorm modules -> rms_norm"
        assert "attention_transformers" in sub.routes
        patch = oh.apply(ours)
        assert set(patch.routes) == {"rms_norm", "fused_add_rms_norm", "mlp", "attention"}
        # partial's attentions run transformers' apply_rotary_pos_emb, not the Liger function
        # the module binds now (which would raise here)
        with counting_providers() as calls:
            for model in (early, ours, partial):
                assert_fp32_close(logits(model, ids), ref)
        assert calls == {
            "rms_norm": 3 + 3 + 5, "fused_add_rms_norm": 2 + 2, "silu_and_mul": 2 + 2 + 2,
            "rotary_embedding": 2 + 2,
        }  # fmt: skip
        with pytest.raises(oh.UnsupportedModelError, match="instance-level forward"):
            oh.apply(theirs)  # Liger's model stays Liger's

    def test_model_built_after_liger_rebinding_is_refused_naming_it(liger):
        # A model built after the rebinding is made of Liger's classes: opcore does not
        # patch them as if they were transformers' (nor skip them silently under ops=).
        variant = "llama-h96-d64-gqa1-tied"
        liger.apply_liger_kernel_to_llama(model=make_model(variant))
        built = transformers.LlamaForCausalLM(make_config(variant)).eval()
        before = snapshot(built)
        for ops_arg in (None, ["rms_norm"], ["silu_and_mul"]):
            with pytest.raises(oh.UnsupportedModelError, match="nothing was changed") as err:
                oh.apply(built, ops=ops_arg)
            assert_same_snapshot(before, snapshot(built))
        msg = str(err.value)  # ops=["silu_and_mul"]: the MLPs only
        assert (
            "model.layers.1.mlp is LigerSwiGLUMLP (liger_kernel.transformers.swiglu), "
            "not transformers' LlamaMLP" in msg
        )
        assert (
            "another library rebound transformers.models.llama.modeling_llama.LlamaMLP "
            "to liger_kernel.transformers.swiglu.LigerSwiGLUMLP" in msg
        )
        assert "RMSNorm" not in msg
        with pytest.raises(oh.UnsupportedModelError) as err:
            oh.apply(built)
        assert "model.norm is LigerRMSNorm (liger_kernel.transformers.rms_norm)" in str(err.value)
        # the transformers parts of it can still be patched: attention and rotary
        with oh.patched(built, ops=["rotary_embedding"]) as patch:
            assert set(patch.routes) == {"attention"}

    def test_model_built_after_rebinding_to_a_subclass_is_refused(monkeypatch):
        ml = transformers.models.llama.modeling_llama

        class TracingRMSNorm(ml.LlamaRMSNorm):  # another library's subclass, bound in its place
            pass

        monkeypatch.setattr(ml, "LlamaRMSNorm", TracingRMSNorm)
        model = transformers.LlamaForCausalLM(make_config("llama-h96-d64-gqa1-tied")).eval()
        assert type(model.model.norm) is TracingRMSNorm
        before = snapshot(model)
        with pytest.raises(oh.UnsupportedModelError) as err:
            oh.apply(model, ops=["rms_norm"])
        assert re.search(
            r"model\.norm: \S*TracingRMSNorm subclasses the RMSNorm class", str(err.value)
        )
        assert_same_snapshot(before, snapshot(model))

    def test_names_rebound_before_import_are_refused(monkeypatch):
        # opcore keeps transformers' names when it is imported (keep_originals, once per
        # architecture): if another library rebound one before that, what it kept is not
        # transformers', and apply on that architecture says so. Here the keeping of Qwen2's
        # names is run again after a rebinding, as an import after it would run it.
        m = transformers.models.qwen2.modeling_qwen2
        original = m.apply_rotary_pos_emb

        def rope(q, k, cos, sin, unsqueeze_dim=1):  # another library's, bound in its place
            return original(q, k, cos, sin, unsqueeze_dim)

        monkeypatch.setattr(m, "apply_rotary_pos_emb", rope)
        monkeypatch.delitem(_arch._ORIGINALS, "qwen2")  # both put back after the test
        monkeypatch.setattr(_arch, "_NOT_ORIGINAL", dict(_arch._NOT_ORIGINAL))
        _arch.keep_originals()
        model = make_model("qwen2-h136-d128-gqa4-bias-yarn")
        for ops_arg in (None, ["rms_norm"]):  # both routes would call it
            with pytest.raises(oh.UnsupportedModelError) as err:
                oh.apply(model, ops=ops_arg)
            assert (
                "transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb was already "
                f"{__name__}.{rope.__qualname__} when opcore.integrations.transformers was "
                "imported"
            ) in str(err.value)
        assert not oh.is_patched(model)
        oh.apply(make_model("llama-h96-d64-gqa1-tied")).revert()  # other architectures: as ever

    @pytest.mark.parametrize(
        "variant", ["qwen2-h136-d128-gqa4-bias-yarn", "qwen3-h96-d128-gqa2-tied"]
    )
    def test_meta_device_model_builds_its_rotary_cache_on_the_first_real_forward(variant):
        # The big-model flow: build on the meta device, apply, to_empty, load the weights,
        # initialise the non-persistent inv_freq (transformers' own init, which the
        # unpatched model needs as much). The cos/sin cache cannot be built on meta (it would
        # stay meta, then hold uninitialised memory after to_empty): the first forward on a
        # real device builds it from the rotary module's inv_freq.
        _, model_name, _ = VARIANTS[variant]
        ids = tokens()
        ref_model = make_model(variant)
        state = ref_model.state_dict()
        ref = logits(ref_model, ids)

        def materialised(patch_it: bool):
            with torch.device("meta"):
                model = getattr(transformers, model_name)(make_config(variant)).eval()
            patch = oh.apply(model) if patch_it else None
            model.to_empty(device="cpu")
            model.load_state_dict(state)
            model._init_weights(model.model.rotary_emb)
            return model, patch

        unpatched, _ = materialised(False)
        assert torch.equal(logits(unpatched, ids), ref)  # the flow itself is sound
        model, patch = materialised(True)
        assert_fp32_close(logits(model, ids), ref)
        assert "first forward" in patch.routes["rotary_cache"], patch.routes
        assert "on the meta device" in patch.routes["attention_split"]
        rotary = model.model.rotary_emb
        with oh.patched(ref_model):  # the cache a model patched on the CPU builds
            assert torch.equal(
                rotary._opcore_cos_sin_cache, ref_model.model.rotary_emb._opcore_cos_sin_cache
            )
        assert_fp32_close(logits(model, ids), ref)  # built once, reused
        patch.revert()
        assert "_opcore_cos_sin_cache" not in rotary._buffers
        assert torch.equal(logits(model, ids), ref)

    def test_ops_subset_patches_only_those_modules():
        model = make_model("mistral-h200-d64-gqa8-window16")
        ids = tokens()
        ref = logits(model, ids)
        with oh.patched(model, ops=["rms_norm", "silu_and_mul"]) as patch:
            assert set(patch.routes) == {"rms_norm", "mlp", "attention_transformers"}
            # the attention is transformers' own computation, with the apply_rotary_pos_emb
            # kept at import (a rebinding of the module's function cannot reach it)
            assert (
                "no opcore op: rotary_embedding was not chosen"
                in (patch.routes["attention_transformers"])
            )
            kinds = {type(m).__name__ for m in model.modules()}
            assert {
                "OpcoreMistralRMSNorm",
                "OpcoreMistralMLP",
                "OpcoreMistralAttention",
                "MistralDecoderLayer",
                "MistralRotaryEmbedding",
            } <= kinds
            assert not {"OpcoreMistralDecoderLayer", "OpcoreMistralRotaryEmbedding"} & kinds
            assert not any("qkv" in n for n, _ in model.named_buffers())  # q/k/v as they are
            assert_fp32_close(logits(model, ids), ref)
        qwen3 = make_model("qwen3-h120-d64-gqa4")  # q/k norm modules, then rotary
        ref = logits(qwen3, ids)
        with oh.patched(qwen3, ops=["rms_norm"]) as patch:
            assert patch.routes["rms_norm"] == "9 RMSNorm modules -> rms_norm"
            assert "attention_transformers" in patch.routes
            assert_fp32_close(logits(qwen3, ids), ref)

    def test_context_manager_reverts_on_error():
        model = make_model("llama-h96-d64-gqa1-tied")
        with pytest.raises(RuntimeError, match="inside"):
            with oh.patched(model):
                assert oh.is_patched(model)
                raise RuntimeError("inside")
        assert not oh.is_patched(model)
        assert not any(type(m).__name__.startswith("Opcore") for m in model.modules())

    def test_mixed_parameter_dtypes_are_refused():
        model = make_model("llama-h96-d64-gqa1-tied", torch.bfloat16)
        model.model.layers[1].post_attention_layernorm.float()
        before = snapshot(model)
        with pytest.raises(
            oh.UnsupportedModelError, match=r"dtypes \['torch.bfloat16', 'torch.float32'\]"
        ):
            oh.apply(model)
        assert_same_snapshot(before, snapshot(model))

    def test_apply_twice_and_bad_ops_are_refused():
        model = make_model("llama-h96-d64-gqa1-tied")
        with pytest.raises(ValueError, match="unknown op"):
            oh.apply(model, ops=["rms_norm", "flash"])
        with pytest.raises(ValueError, match="do not apply to this llama model"):
            oh.apply(model, ops=["split_qkv_rmsnorm_rope"])
        assert not oh.is_patched(model)
        with oh.patched(model):
            with pytest.raises(oh.UnsupportedModelError, match="already patched"):
                oh.apply(model)
        assert not oh.is_patched(model)

    def test_failure_while_patching_reverts_what_was_done(monkeypatch):
        # An injected failure (standing in for running out of memory) on the third weight
        # fusion: the model must come back unpatched and computing what it did.
        model = make_model("qwen2-h136-d128-gqa4-bias-yarn")
        ids = tokens()
        ref = logits(model, ids)
        classes = [type(m) for m in model.modules()]
        real, calls = _fuse.fuse, []

        def failing(owner, name, linears):
            calls.append(name)
            if len(calls) == 3:
                raise MemoryError("injected: out of memory while fusing")
            real(owner, name, linears)

        monkeypatch.setattr(_fuse, "fuse", failing)
        with pytest.raises(MemoryError, match="injected"):
            oh.apply(model)
        assert len(calls) == 3
        assert [type(m) for m in model.modules()] == classes
        assert not any(n.startswith("_opcore") or "._opcore" in n for n, _ in model.named_buffers())
        assert not any(k.startswith("_opcore") for m in model.modules() for k in m.__dict__)
        assert not oh.is_patched(model)
        assert torch.equal(logits(model, ids), ref)

    def test_version_outside_tested_range_is_refused(monkeypatch):
        assert _versions.check("5.17.0") is None and _versions.check("5.24.3") is None
        assert "5.16.1" in _versions.check("5.16.1") and ">=5.17,<5.25" in _versions.check(
            "5.25.0.dev0"
        )
        model = make_model("llama-h96-d64-gqa1-tied")
        # The module `import transformers` gives now: transformers' lazy module replaced its
        # sys.modules entry when opcore's import loaded the modeling modules, so the check
        # must read this one (it read the object bound at import, and then passed only in
        # a run whose test module was imported before the swap).
        monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.30.0")
        with pytest.raises(oh.UnsupportedModelError, match="transformers 5.30.0 is outside"):
            oh.apply(model)
        assert not oh.is_patched(model)
        oh.apply(model, check_version=False).revert()

    # Counting providers, first in each op's priority: proof that every replacement goes
    # through opcore.ir dispatch (and so through whatever provider a platform puts first).
    _CALLS: dict[str, int] = {}

    def _count(name):
        _CALLS[name] = _CALLS.get(name, 0) + 1
        return getattr(ops, name).native

    def _rms_norm(x, weight, epsilon, variance_size=None):
        return _count("rms_norm")(x, weight, epsilon, variance_size)

    def _fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
        return _count("fused_add_rms_norm")(x, x_residual, weight, epsilon, variance_size)

    def _silu_and_mul(x):
        return _count("silu_and_mul")(x)

    def _gelu_and_mul(x, approximate="none"):
        return _count("gelu_and_mul")(x, approximate)

    def _rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
        return _count("rotary_embedding")(positions, query, key, head_size, cos_sin_cache, is_neox)

    def _split_qkv_rmsnorm_rope(
        qkv,
        q_weight,
        k_weight,
        epsilon,
        positions,
        cos_sin_cache,
        num_heads,
        num_kv_heads,
        head_size,
        is_neox,
    ):
        return _count("split_qkv_rmsnorm_rope")(
            qkv,
            q_weight,
            k_weight,
            epsilon,
            positions,
            cos_sin_cache,
            num_heads,
            num_kv_heads,
            head_size,
            is_neox,
        )

    _COUNTERS = [
        _rms_norm,
        _fused_add_rms_norm,
        _silu_and_mul,
        _gelu_and_mul,
        _rotary_embedding,
        _split_qkv_rmsnorm_rope,
    ]

    @contextlib.contextmanager
    def counting_providers():
        _CALLS.clear()
        with contextlib.ExitStack() as stack:
            for fn in _COUNTERS:
                op = getattr(ops, fn.__name__[1:])
                stack.enter_context(temporary_impl(op, "counting_test", fn))
                stack.enter_context(op.set_priority(["counting_test"]))
            yield _CALLS

    @pytest.mark.parametrize(
        "variant, expected",
        [
            (
                "qwen3-h96-d128-gqa2-tied",
                {
                    "rms_norm": 3,
                    "fused_add_rms_norm": 2,
                    "silu_and_mul": 2,
                    "split_qkv_rmsnorm_rope": 2,
                },
            ),
            (
                "llama-h72-d32-gelutanh-llama3rope-bias",
                {"rms_norm": 3, "fused_add_rms_norm": 2, "gelu_and_mul": 2, "rotary_embedding": 2},
            ),
        ],
    )
    def test_every_replacement_dispatches_through_opcore_ops(variant, expected):
        # rms_norm: two input norms and the final norm; the post-attention norms are in
        # fused_add_rms_norm and Qwen3's q/k norms in split_qkv_rmsnorm_rope.
        model = make_model(variant)
        ids = tokens()
        ref = logits(model, ids)
        with oh.patched(model), counting_providers() as calls:
            got = logits(model, ids)
        assert calls == expected
        assert_fp32_close(got, ref)

    def test_hooked_projection_takes_the_two_halves_route():
        model = make_model("mistral-h200-d64-gqa8-window16")
        ids = tokens()
        ref = logits(model, ids)
        seen = []
        model.model.layers[0].mlp.up_proj.register_forward_hook(
            lambda m, i, o: seen.append(o.shape)
        )
        model.model.layers[1].self_attn.k_proj.register_forward_hook(
            lambda m, i, o: seen.append(o.shape)
        )
        with oh.patched(model) as patch:
            assert "1 MLPs: one fused gate_up GEMM" in patch.routes["mlp"]
            assert "1 MLPs: gate and up GEMMs, concatenated" in patch.routes["mlp_split"]
            assert "forward hooks" in patch.routes["mlp_split"]
            assert "1 attentions: q/k/v GEMMs (separate)" in patch.routes["attention_split"]
            got = logits(model, ids)
        assert len(seen) == 2  # the hooks ran: the hooked projections were called
        assert_fp32_close(got, ref)

    def test_dtype_change_after_apply_keeps_parameters_and_fused_weights_one_storage():
        model = make_model("qwen3-h120-d64-gqa4")
        ids = tokens()
        with oh.patched(model):
            model.to(torch.bfloat16)
            mlp = model.model.layers[0].mlp
            assert mlp._opcore_gate_up_weight.dtype == torch.bfloat16
            assert mlp.gate_proj.weight.data_ptr() == mlp._opcore_gate_up_weight.data_ptr()
            got = logits(model, ids)
            # an in-place load into a parameter reaches the fused weight
            with torch.no_grad():
                model.model.layers[0].mlp.up_proj.weight.mul_(2)
            got2 = logits(model, ids)
        ref2 = logits(model, ids)
        assert not torch.equal(got, got2)
        torch.testing.assert_close(got2, ref2, atol=0.05 * float(ref2.abs().max()), rtol=0)

    def test_gradients_match_unpatched():
        model = make_model("llama-h72-d32-gelutanh-llama3rope-bias")
        ids = tokens()

        def grads():
            model.zero_grad()
            out = model(ids, labels=ids)
            out.loss.backward()
            return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

        loss, want = grads()
        with oh.patched(model):
            loss2, got = grads()
        torch.testing.assert_close(loss2, loss, atol=1e-5, rtol=1e-5)
        for n in want:
            torch.testing.assert_close(got[n], want[n], atol=1e-5, rtol=1e-4, msg=n)

    def test_class_level_patch_applies_on_from_pretrained(tmp_path):
        make_model("qwen3-h96-d128-gqa2-tied").save_pretrained(tmp_path)
        ids = tokens()
        ref = logits(transformers.Qwen3ForCausalLM.from_pretrained(tmp_path).eval(), ids)
        assert oh.apply_to_qwen3() is None
        try:
            with pytest.raises(oh.UnsupportedModelError, match="already patched"):
                oh.apply_to_qwen3()
            loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
            assert oh.is_patched(loaded)
            assert not oh.is_patched(
                transformers.LlamaForCausalLM(make_config("llama-h96-d64-gqa1-tied"))
            )
            assert oh.is_patched(
                transformers.AutoModelForCausalLM.from_config(make_config("qwen3-h120-d64-gqa4"))
            )
            assert_fp32_close(logits(loaded, ids), ref)
        finally:
            oh.revert_classes("qwen3")
        assert not oh.is_patched(transformers.Qwen3ForCausalLM.from_pretrained(tmp_path))
        assert "from_pretrained" not in transformers.Qwen3PreTrainedModel.__dict__

    @pytest.mark.parametrize("backend", ["aot_eager", "opcore"])
    def test_torch_compile_fullgraph_matches_eager(backend):
        import opcore.compile as oc

        model = make_model("qwen3-h96-d128-gqa2-tied")
        ids = tokens()
        ref = logits(model, ids)
        torch._dynamo.reset()
        be = oc.backend(mode="eager") if backend == "opcore" else backend
        try:
            with oh.patched(model):
                compiled = torch.compile(model, backend=be, fullgraph=True)
                for _ in range(2):
                    assert_fp32_close(logits(compiled, ids), ref)
        finally:
            torch._dynamo.reset()
        if backend == "opcore":
            ops_seen = be.last_record.by_op()
            assert {
                "split_qkv_rmsnorm_rope",
                "fused_add_rms_norm",
                "rms_norm",
                "silu_and_mul",
            } <= set(ops_seen), ops_seen

    @pytest.mark.parametrize("backend", ["aot_eager", "opcore"])
    def test_generate_through_hf_static_cache_compile_path(backend):
        # transformers compiles the decode forward itself when the cache is static; it does
        # so only on accelerators unless told otherwise (`_compile_all_devices`, its switch).
        # With the opcore backend this is the patched model + opcore compile path of the
        # benchmark (there with Inductor and CUDA graphs).
        import opcore.compile as oc

        model = make_model("qwen3-h96-d128-gqa2-tied")
        ids = tokens(2, 9)
        kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
        be = oc.backend(mode="eager") if backend == "opcore" else backend
        # mode=None: torch.compile hands a mode to a backend callable as an argument, which
        # the opcore backend (whose mode is its own argument) does not take
        compile_config = transformers.CompileConfig(backend=be, fullgraph=True, mode=None)
        compile_config._compile_all_devices = True
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        try:
            with torch.no_grad():
                want = model.generate(ids, **kw)
                with oh.patched(model):
                    got = model.generate(
                        ids, cache_implementation="static", compile_config=compile_config, **kw
                    )
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        finally:
            torch._dynamo.reset()
        assert graphs >= 1  # the compiled path ran
        assert torch.equal(got, want)
        if backend == "opcore":  # the graph kept the opcore ops and lowered them
            assert "split_qkv_rmsnorm_rope" in be.last_record.by_op()

    def test_on_the_virtual_device_in_a_child():
        # torch renames PrivateUse1 once per process: the virtual device runs in a child
        pytest.importorskip("opcore_plugin_vdev", reason="opcore-plugin-vdev is not installed")
        env = {**os.environ, "OPCORE_VDEV": "1", "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "--import-mode=importlib", "-x", __file__],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
        assert f"{len(VARIANTS)} passed" in proc.stdout, proc.stdout[-3000:]

    def test_under_triton_interpreter_with_triton_first():
        rerun_under_triton_interpreter(
            __file__, env={"OMP_NUM_THREADS": "1", "OPCORE_LOG_DISPATCH": "1"}
        )

else:
    pytest.importorskip("triton")
    import opcore.kernels.triton  # noqa: F401  (registers the provider)

    USED = (
        "rms_norm",
        "fused_add_rms_norm",
        "silu_and_mul",
        "rotary_embedding",
        "split_qkv_rmsnorm_rope",
    )

    @pytest.mark.parametrize("variant", ["qwen3-h96-d128-gqa2-tied", "llama-h96-d64-gqa1-tied"])
    def test_triton_provider_first_matches_unpatched(variant, caplog):
        model = make_model(variant, num_hidden_layers=1)  # the interpreter is slow
        ids = tokens(1, 5)
        ref = logits(model, ids)
        with oh.patched(model), contextlib.ExitStack() as stack:
            for name in USED:
                stack.enter_context(getattr(ops, name).set_priority(["triton", "native"]))
            with caplog.at_level(logging.INFO):
                got = logits(model, ids)
        chosen = {
            r.getMessage().split("(")[0]: r.getMessage().rsplit("-> ", 1)[1]
            for r in caplog.records
            if "-> " in r.getMessage()
        }
        expected = {"rms_norm", "fused_add_rms_norm", "silu_and_mul"}
        expected.add(
            "split_qkv_rmsnorm_rope" if variant.startswith("qwen3") else "rotary_embedding"
        )
        assert {
            op for op, provider in chosen.items() if provider.startswith("triton")
        } == expected, chosen
        torch.testing.assert_close(got, ref, atol=1e-4 * float(ref.abs().max()), rtol=1e-4)

    @pytest.mark.parametrize(
        "variant", ["mistral-h200-d64-gqa8-window16", "qwen2-h136-d128-gqa4-bias-yarn"]
    )
    def test_triton_first_greedy_generate_fp32_and_bf16_logits(variant):
        # GQA 8 and 4, odd hidden sizes, biases: 8 greedy tokens through generate() token
        # for token, and bf16 logits within bf16's own distance from fp32
        model = make_model(variant, num_hidden_layers=1)
        ids = tokens(2, 5)
        kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
        with torch.no_grad():
            want = model.generate(ids, **kw)
        ref32 = logits(model, ids)
        model16 = make_model(variant, torch.bfloat16, num_hidden_layers=1)
        ref16 = logits(model16, ids)
        noise = float((ref16 - ref32).abs().max())
        with contextlib.ExitStack() as stack:
            for name in USED:
                stack.enter_context(getattr(ops, name).set_priority(["triton", "native"]))
            with oh.patched(model), torch.no_grad():
                got = model.generate(ids, **kw)
            with oh.patched(model16):
                got16 = logits(model16, ids)
        assert torch.equal(got, want), (got, want)
        assert float((got16 - ref16).abs().max()) <= 2 * noise + 1e-3

    def test_triton_first_decode_with_expanded_positions():
        # batch 2, one token each, position_ids a stride-0 expansion (as a decode loop
        # passes them): the Triton kernels must see each sequence's position
        model = make_model("qwen3-h96-d128-gqa2-tied", num_hidden_layers=1)
        ids = tokens(2, 1)
        pos = torch.tensor([[37]]).expand(2, -1)
        ref = logits(model, ids, position_ids=pos)
        with oh.patched(model), contextlib.ExitStack() as stack:
            for name in USED:
                stack.enter_context(getattr(ops, name).set_priority(["triton", "native"]))
            got = logits(model, ids, position_ids=pos)
        torch.testing.assert_close(got, ref, atol=1e-4 * float(ref.abs().max()), rtol=1e-4)

    def test_liger_rope_model_beside_opcore_models(liger):
        # Side by side in one process, each computing its own: Liger's model runs Liger's
        # rotary Triton kernel (interpreted here; its RMSNorm and SwiGLU kernels do not run
        # under this Triton's interpreter, so Liger patches the rotary only), the opcore
        # model opcore's Triton kernels, and the one patched without the rotary op
        # transformers' apply_rotary_pos_emb, not the Liger function the module binds now
        # (autograd's graph names Liger's function where it ran).
        variant = "llama-h96-d64-gqa1-tied"
        ml = transformers.models.llama.modeling_llama
        ids = tokens(1, 5)
        ref = logits(make_model(variant, num_hidden_layers=1), ids)
        theirs, ours, partial = (make_model(variant, num_hidden_layers=1) for _ in range(3))
        liger.apply_liger_kernel_to_llama(
            rope=True, rms_norm=False, swiglu=False, fused_linear_cross_entropy=False,
            model=theirs,
        )  # fmt: skip
        assert ml.apply_rotary_pos_emb is liger.liger_rotary_pos_emb
        oh.apply(ours)
        # the MLP only: the residual stream keeps autograd's graph through the attention
        # (the Triton providers' outputs have none)
        oh.apply(partial, ops=["silu_and_mul"])
        tol = dict(atol=1e-4 * float(ref.abs().max()), rtol=1e-4)
        with contextlib.ExitStack() as stack:
            for name in USED:
                stack.enter_context(getattr(ops, name).set_priority(["triton", "native"]))
            graphs = {}
            for name, model in (("theirs", theirs), ("ours", ours), ("partial", partial)):
                out = model(ids).logits.float()  # with autograd: its graph names what ran
                graphs[name] = autograd_nodes(out)
                torch.testing.assert_close(out.detach(), ref, **tol, msg=name)
        assert "LigerRopeFunctionBackward" in graphs["theirs"], graphs["theirs"]
        assert "MulBackward0" in graphs["partial"]  # transformers' rotary: q * cos + ...
        assert not any("Liger" in n for n in graphs["partial"]), graphs["partial"]
