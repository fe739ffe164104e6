"""Each op against a reference written from the math in float64 (not from the native
function), over every quick sample, in fp32, fp16 and bf16."""

from __future__ import annotations

import math

import pytest
import torch

from opcore.ir import all_ops, ops


def ref_rms_norm(x, weight, epsilon, variance_size=None):
    hidden = x.shape[-1]
    n = variance_size or hidden
    rows = x.double().reshape(-1, hidden)
    out = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        row = rows[i]
        mean_square = float((row[:n] * row[:n]).sum()) / n
        out[i] = row / math.sqrt(mean_square + epsilon)
        if weight is not None:
            out[i] *= weight.double()
    return out.reshape(x.shape)


def ref_fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
    residual = (x.double() + x_residual.double()).to(x.dtype)  # rounded once to the dtype
    return ref_rms_norm(residual, weight, epsilon, variance_size), residual.double()


def ref_silu_and_mul(x):
    d = x.shape[-1] // 2
    a, b = x.double()[..., :d], x.double()[..., d:]
    return a / (1.0 + torch.exp(-a)) * b


def ref_gelu_and_mul(x, approximate="none"):
    d = x.shape[-1] // 2
    a, b = x.double()[..., :d], x.double()[..., d:]
    if approximate == "tanh":
        g = 0.5 * a * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a**3)))
    else:
        g = 0.5 * a * (1.0 + torch.erf(a / math.sqrt(2.0)))
    return g * b


def _ref_rope(positions, t, head_size, cache, is_neox):
    """Rotate feature pairs one pair index at a time."""
    pos = positions.reshape(-1).long()
    x = t.double().reshape(pos.numel(), -1, head_size)
    out = x.clone()
    half = cache.shape[1] // 2
    for i in range(half):
        a, b = (i, i + half) if is_neox else (2 * i, 2 * i + 1)
        cos = cache[pos, i].double()[:, None]
        sin = cache[pos, half + i].double()[:, None]
        out[..., a] = x[..., a] * cos - x[..., b] * sin
        out[..., b] = x[..., b] * cos + x[..., a] * sin
    return out


def ref_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    q = _ref_rope(positions, query, head_size, cos_sin_cache, is_neox).reshape(query.shape)
    k = (
        None
        if key is None
        else _ref_rope(positions, key, head_size, cos_sin_cache, is_neox).reshape(key.shape)
    )
    return q, k


def ref_split_qkv_rmsnorm_rope(
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
    lead = qkv.shape[:-1]
    flat = qkv.double().reshape(-1, qkv.shape[-1])
    q_end, k_end = num_heads * head_size, (num_heads + num_kv_heads) * head_size

    def norm(part, heads, weight):
        t = part.reshape(-1, heads, head_size)
        t = t / torch.sqrt((t * t).sum(-1, keepdim=True) / head_size + epsilon)
        return t if weight is None else t * weight.double()

    q = _ref_rope(
        positions, norm(flat[:, :q_end], num_heads, q_weight), head_size, cos_sin_cache, is_neox
    )
    k = _ref_rope(
        positions,
        norm(flat[:, q_end:k_end], num_kv_heads, k_weight),
        head_size,
        cos_sin_cache,
        is_neox,
    )
    v = flat[:, k_end:]
    return q.reshape(*lead, -1), k.reshape(*lead, -1), v.reshape(*lead, -1)


def _top(scores: list[float], k: int, allowed=None) -> list[int]:
    """The ``k`` best indices by score, descending; equal scores: the lower index first."""
    pool = [i for i in range(len(scores)) if allowed is None or i in allowed]
    chosen = []
    for _ in range(k):
        best = None
        for i in pool:
            if i not in chosen and (best is None or scores[i] > scores[best]):
                best = i  # strictly greater: on a tie the lower index, seen first, stays
        chosen.append(best)
    return chosen


def _routing(weights_rows, ids_rows):
    w = torch.tensor(weights_rows, dtype=torch.float64)
    return w, torch.tensor(ids_rows, dtype=torch.int64)


def ref_topk_softmax(gating_output, topk, renormalize):
    rows_w, rows_i = [], []
    for row in gating_output.double().tolist():
        m = max(row)
        e = [math.exp(v - m) for v in row]
        p = [v / sum(e) for v in e]
        ids = _top(row, topk)  # the order of the probabilities is the order of the logits
        w = [p[i] for i in ids]
        if renormalize:
            w = [v / sum(w) for v in w]
        rows_w.append(w)
        rows_i.append(ids)
    return _routing(rows_w, rows_i)


def ref_grouped_topk(
    gating_output,
    topk,
    renormalize,
    num_expert_group,
    topk_group,
    scoring_func="softmax",
    routed_scaling_factor=1.0,
    e_score_correction_bias=None,
):
    bias = None if e_score_correction_bias is None else e_score_correction_bias.double().tolist()
    rows_w, rows_i = [], []
    for row in gating_output.double().tolist():
        if scoring_func == "softmax":
            m = max(row)
            e = [math.exp(v - m) for v in row]
            s = [v / sum(e) for v in e]
        else:
            s = [1.0 / (1.0 + math.exp(-v)) for v in row]
        select = row if bias is None else [a + b for a, b in zip(s, bias, strict=True)]
        per = len(row) // num_expert_group
        groups = []
        for g in range(num_expert_group):
            members = sorted(select[g * per : (g + 1) * per], reverse=True)
            groups.append(members[0] if bias is None else sum(members[:2]))
        kept = _top(groups, topk_group)
        allowed = {g * per + j for g in kept for j in range(per)}
        ids = _top(select, topk, allowed)
        w = [s[i] for i in ids]
        if renormalize:
            w = [v / sum(w) for v in w]
        rows_w.append([v * routed_scaling_factor for v in w])
        rows_i.append(ids)
    return _routing(rows_w, rows_i)


def ref_fused_experts(
    hidden_states,
    w13,
    w2,
    topk_weights,
    topk_ids,
    activation="silu",
    apply_router_weight_on_input=False,
):
    x, a, b = hidden_states.double(), w13.double(), w2.double()
    inter = w2.shape[2]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e, w = int(topk_ids[t, j]), float(topk_weights[t, j])
            xt = x[t] * w if apply_router_weight_on_input else x[t]
            gu = a[e] @ xt
            g, u = gu[:inter], gu[inter:]
            if activation == "silu":
                act = g / (1.0 + torch.exp(-g))
            else:
                act = 0.5 * g * (1.0 + torch.erf(g / math.sqrt(2.0)))
            y = b[e] @ (act * u)
            out[t] += y if apply_router_weight_on_input else w * y
    return out


# Routing outputs are float32 weights and integer ids in every dtype: compared apart.
ROUTING_REFERENCES = {"topk_softmax": ref_topk_softmax, "grouped_topk": ref_grouped_topk}

REFERENCES = {
    "fused_experts": ref_fused_experts,
    "rms_norm": ref_rms_norm,
    "fused_add_rms_norm": ref_fused_add_rms_norm,
    "silu_and_mul": ref_silu_and_mul,
    "gelu_and_mul": ref_gelu_and_mul,
    "rotary_embedding": ref_rotary_embedding,
    "split_qkv_rmsnorm_rope": ref_split_qkv_rmsnorm_rope,
}


def _produces_fp8(op) -> bool:
    sample = next(iter(op.sample_inputs("cpu", torch.float32))).to("meta")
    out = op.fake_impl(*sample.args, **sample.kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    return any(o is not None and o.dtype.itemsize == 1 and o.is_floating_point() for o in outs)


def test_every_op_has_a_reference():
    # Ops with fp8 outputs have theirs in test_ir_quant_ops.py (compared code by code).
    assert set(REFERENCES) | set(ROUTING_REFERENCES) == {
        n for n, op in all_ops().items() if not _produces_fp8(op)
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op_name", sorted(ROUTING_REFERENCES))
def test_routing_matches_reference(op_name, dtype):
    """Ids exactly (ties to the lower id), weights within float32 rounding."""
    op = all_ops()[op_name]
    count = 0
    for sample in op.sample_inputs("cpu", dtype):
        weights, ids = op(*sample.args, **sample.kwargs)
        want_w, want_i = ROUTING_REFERENCES[op_name](*sample.args, **sample.kwargs)
        assert weights.dtype == torch.float32 and ids.dtype == torch.int32, sample.name
        assert torch.equal(ids.long(), want_i), f"{op_name} {sample.name}: ids"
        torch.testing.assert_close(weights.double(), want_w, atol=2e-6, rtol=2e-6)
        count += 1
    assert count >= 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op_name", sorted(REFERENCES))
def test_op_matches_reference(op_name, dtype):
    op = all_ops()[op_name]
    atol, rtol = op.tolerance(dtype)
    count = 0
    for sample in op.sample_inputs("cpu", dtype):
        got = op(*sample.args, **sample.kwargs)
        want = REFERENCES[op_name](*sample.args, **sample.kwargs)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if w is None:
                assert g is None, f"{sample.name}: output {i} should be None"
                continue
            assert g.dtype == dtype and g.shape == w.shape, sample.name
            torch.testing.assert_close(
                g.double(),
                w,
                atol=atol,
                rtol=rtol,
                msg=lambda m, s=sample.name, i=i: f"{op_name} {s} output {i}: {m}",
            )
        count += 1
    assert count >= 5


def test_fused_split_matches_unfused_chain():
    """split_qkv_rmsnorm_rope agrees with slicing + rms_norm per head + rotary_embedding."""
    for sample in ops.split_qkv_rmsnorm_rope.sample_inputs("cpu", torch.float32):
        qkv, qw, kw, eps, pos, cache, h, kv, d, neox = sample.args
        q, k, v = ops.split_qkv_rmsnorm_rope(*sample.args)
        qs, ks, vs = qkv.split([h * d, kv * d, kv * d], dim=-1)
        qn = ops.rms_norm(qs.unflatten(-1, (h, d)), qw, eps).flatten(-2)
        kn = ops.rms_norm(ks.unflatten(-1, (kv, d)), kw, eps).flatten(-2)
        q2, k2 = ops.rotary_embedding(pos, qn, kn, d, cache, neox)
        torch.testing.assert_close(q, q2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(k, k2, atol=1e-5, rtol=1e-5)
        assert torch.equal(v, vs)


def test_rotary_styles_differ_and_partial_rotary_passes_through():
    sample = next(
        s for s in ops.rotary_embedding.sample_inputs() if s.name.startswith("partial_t5")
    )
    pos, q, k, d, cache, _ = sample.args
    neox, _ = ops.rotary_embedding(pos, q, k, d, cache, True)
    gptj, _ = ops.rotary_embedding(pos, q, k, d, cache, False)
    rot = cache.shape[1]
    heads = lambda t: t.reshape(t.shape[0], -1, d)  # noqa: E731
    assert not torch.allclose(heads(neox)[..., :rot], heads(gptj)[..., :rot])
    assert torch.equal(heads(neox)[..., rot:], heads(q)[..., rot:])
    assert torch.equal(heads(gptj)[..., rot:], heads(q)[..., rot:])
