"""The mixture-of-experts ops: each against a reference written from its formula with
Python loops in float64 (per token, per expert), the tie rule on hand-picked logits,
DeepSeek-V3 group selection, unused experts, validators and fakes."""

from __future__ import annotations

import math

import pytest
import torch

from opcore.ir import ops


def ref_topk(scores: list[float], k: int) -> list[int]:
    """Descending, equal scores toward the lower id: the documented rule, by hand."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]


def test_topk_softmax_tie_rule_and_weights():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    w, ids = ops.topk_softmax(logits, 4, False)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.tolist() == [[1, 2, 4, 5], [0, 1, 2, 3]]
    p = torch.softmax(logits.double(), dim=-1)
    torch.testing.assert_close(w.double(), p.gather(1, ids.long()), rtol=1e-6, atol=0)
    wr, idr = ops.topk_softmax(logits, 4, True)
    assert idr.tolist() == ids.tolist()
    torch.testing.assert_close(wr.sum(-1), torch.ones(2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_topk_softmax_matches_loop(dtype):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 40, generator=g).to(dtype)
    w, ids = ops.topk_softmax(logits, 6, True)
    for t in range(9):
        row = logits[t].double().tolist()
        want = ref_topk(row, 6)
        assert ids[t].tolist() == want
        e = [math.exp(v) for v in row]
        chosen = [e[i] for i in want]
        assert w[t].tolist() == pytest.approx([c / sum(chosen) for c in chosen], rel=1e-6)


def ref_grouped(logits, k, renorm, groups, topk_group, scoring, scale, bias):
    out_w, out_ids = [], []
    for row in logits.double().tolist():
        if scoring == "softmax":
            m = max(row)
            e = [math.exp(v - m) for v in row]
            s = [v / sum(e) for v in e]
        else:
            s = [1 / (1 + math.exp(-v)) for v in row]
        b = s if bias is None else [a + float(c) for a, c in zip(s, bias.tolist(), strict=True)]
        n = len(row) // groups
        gscore = []
        for gi in range(groups):
            part = sorted(b[gi * n : (gi + 1) * n], reverse=True)
            gscore.append(part[0] if bias is None else sum(part[:2]))
        kept = set(ref_topk(gscore, topk_group))
        # only the kept groups' experts are candidates (not the others masked to -inf)
        cand = [i for i in range(len(b)) if i // n in kept]
        ids = sorted(cand, key=lambda i: (-b[i], i))[:k]
        w = [s[i] for i in ids]
        if renorm:
            w = [v / sum(w) for v in w]
        out_w.append([v * scale for v in w])
        out_ids.append(ids)
    return out_w, out_ids


@pytest.mark.parametrize(
    "scoring,bias,renorm,scale",
    [("sigmoid", True, True, 2.5), ("softmax", False, False, 1.0), ("sigmoid", False, True, 1.0)],
)
def test_grouped_topk_matches_loop(scoring, bias, renorm, scale):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(7, 64, generator=g)
    b = torch.randn(64, generator=g) * 0.3 if bias else None
    w, ids = ops.grouped_topk(logits, 6, renorm, 8, 3, scoring, scale, b)
    want_w, want_ids = ref_grouped(logits, 6, renorm, 8, 3, scoring, scale, b)
    assert ids.tolist() == want_ids
    torch.testing.assert_close(
        w.double(), torch.tensor(want_w, dtype=torch.float64), rtol=1e-6, atol=1e-7
    )


def test_grouped_topk_groups_restrict_and_ties():
    # 3 groups of 2; without a bias a group's score is its max: group 1 (5) first, then
    # groups 0 and 2 tie (2 and 2) and the lower id, group 0, is kept. Among experts 0-3,
    # experts 1 and 3 tie at 0: the lower id, 1, comes first.
    logits = torch.tensor([[2.0, 0.0, 5.0, 0.0, 2.0, 1.0]])
    _, ids = ops.grouped_topk(logits, 3, False, 3, 2)
    assert ids.tolist() == [[2, 0, 1]]
    # with a bias, the group score is the sum of its top two: group 2 (2 + 1) beats group 0
    zero = torch.zeros(6)
    _, ids = ops.grouped_topk(logits, 3, False, 3, 2, "sigmoid", 1.0, zero)
    assert ids.tolist() == [[2, 4, 5]]


NINF = float("-inf")


@pytest.mark.parametrize(
    "logits,k,groups,topk_group,scoring,bias,want",
    [
        # no bias, the order is on the logits: group 1 (max 5) is kept and its expert 3
        # (logit -inf) is the second pick, not expert 0 of the dropped group 0
        ([[0.0, 0.0, 5.0, NINF]], 2, 2, 1, "softmax", None, [[2, 3]]),
        ([[0.0, 0.0, 5.0, NINF]], 2, 2, 1, "sigmoid", None, [[2, 3]]),
        # a -inf bias on a kept expert: b = -inf there; group 1 (s(5) + s(5)) is kept
        ([[0.0, 0.0, 0.0, 5.0, 5.0, 0.0]], 3, 2, 1, "sigmoid", [0, 0, 0, 0, 0, NINF], [[3, 4, 5]]),
        # logits -inf and a -inf bias: s = 0 and b = -inf at expert 5
        ([[0.0, 0.0, 0.0, 5.0, 5.0, NINF]], 3, 2, 1, "softmax", [0, 0, 0, 0, 0, NINF], [[3, 4, 5]]),
        # two kept groups chosen as [3, 1]: ties among their experts still go to the lower
        # id (3 before 7), and the -inf row's picks stay inside groups 1 and 3
        (
            [[0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 2.0], [0.0, 0.0, 1.0, NINF, 0.0, 0.0, 3.0, NINF]],
            4, 4, 2, "softmax", None, [[6, 3, 7, 2], [6, 2, 3, 7]],
        ),
    ],
)  # fmt: skip
def test_grouped_topk_never_picks_an_expert_of_a_dropped_group(
    logits, k, groups, topk_group, scoring, bias, want
):
    # The old native masked dropped experts to -inf, so a kept expert whose score was -inf
    # tied with them and the dropped group's lower id won (ids [2, 0], [3, 4, 0]).
    x = torch.tensor(logits)
    b = None if bias is None else torch.tensor(bias, dtype=torch.float32)
    w, ids = ops.grouped_topk(x, k, True, groups, topk_group, scoring, 1.0, b)
    assert ids.tolist() == want
    per_group = x.shape[1] // groups
    for row in ids.tolist():  # at most topk_group groups appear in a token's ids
        assert len({i // per_group for i in row}) <= topk_group
    # the weights are s at those ids: 0 for a -inf logit, renormalized over the rest
    s = torch.softmax(x, -1) if scoring == "softmax" else torch.sigmoid(x)
    chosen = s.gather(1, ids.long())
    torch.testing.assert_close(w, chosen / chosen.sum(-1, keepdim=True))


def ref_experts(x, w13, w2, weights, ids, activation, on_input):
    xd, a, b = x.double(), w13.double(), w2.double()
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            wt = float(weights[t, j])
            xt = xd[t] * wt if on_input else xd[t]
            gu = a[e] @ xt
            g, u = gu[:inter], gu[inter:]
            act = (
                g * torch.sigmoid(g)
                if activation == "silu"
                else 0.5 * g * (1 + torch.erf(g / math.sqrt(2)))
            )
            y = b[e] @ (act * u)
            out[t] += y if on_input else wt * y
    return out


@pytest.mark.parametrize(
    "dtype,activation,k,on_input",
    [
        (torch.float32, "silu", 2, False),
        (torch.bfloat16, "silu", 4, False),
        (torch.float16, "gelu", 3, False),
        (torch.float32, "gelu", 1, True),
    ],
)
def test_fused_experts_matches_loop(dtype, activation, k, on_input):
    g = torch.Generator().manual_seed(11)
    T, E, H, inter = 6, 12, 40, 24
    x = torch.randn(T, H, generator=g).to(dtype)
    w13 = (torch.randn(E, 2 * inter, H, generator=g) * H**-0.5).to(dtype)
    w2 = (torch.randn(E, H, inter, generator=g) * inter**-0.5).to(dtype)
    weights, ids = ops.topk_softmax(
        torch.randn(T, E // 2, generator=g), k, True
    )  # experts >= 6 unused
    out = ops.fused_experts(x, w13, w2, weights, ids, activation, on_input)
    assert out.dtype == dtype and out.shape == (T, H)
    ref = ref_experts(x, w13, w2, weights, ids, activation, on_input)
    # rounded once from fp32: within one rounding of the output dtype of the exact value
    eps = {torch.float32: 1e-5, torch.bfloat16: 2**-8, torch.float16: 2**-10}[dtype]
    assert ((out.double() - ref).abs() <= eps * ref.abs() + 1e-5).all()


def test_fused_experts_unused_experts_do_not_matter():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 16, generator=g)
    w13 = torch.randn(8, 20, 16, generator=g)
    w2 = torch.randn(8, 16, 10, generator=g)
    ids = torch.tensor([[0, 3], [3, 0], [0, 0], [3, 3]], dtype=torch.int32)
    weights = torch.rand(4, 2, generator=g)
    out = ops.fused_experts(x, w13, w2, weights, ids)
    w13b, w2b = w13.clone(), w2.clone()
    w13b[[1, 2, 4, 5, 6, 7]] = float("nan")
    w2b[[1, 2, 4, 5, 6, 7]] = float("nan")
    assert torch.equal(ops.fused_experts(x, w13b, w2b, weights, ids), out)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda x, a, b, w, i: ops.fused_experts(x, a, b[:, :, :5], w, i), "'w2'"),
        (lambda x, a, b, w, i: ops.fused_experts(x, a, b, w, i, "relu"), "'activation'"),
        (lambda x, a, b, w, i: ops.fused_experts(x, a, b, w, i, "silu", True), "top-1"),
        (lambda x, a, b, w, i: ops.fused_experts(x, a, b, w, i.float()), "'topk_ids'"),
        (lambda x, a, b, w, i: ops.fused_experts(x, a.half(), b, w, i), "'w13'"),
    ],
)
def test_fused_experts_validator(call, match):
    x = torch.randn(3, 8)
    a, b = torch.randn(4, 12, 8), torch.randn(4, 8, 6)
    w, i = ops.topk_softmax(torch.randn(3, 4), 2, True)
    with pytest.raises(ValueError, match=match):
        call(x, a, b, w, i)


def test_routing_validators():
    g = torch.randn(3, 16)
    with pytest.raises(ValueError, match="'topk'"):
        ops.topk_softmax(g, 17, True)
    with pytest.raises(ValueError, match="'gating_output'"):
        ops.topk_softmax(g[0], 2, True)
    with pytest.raises(ValueError, match="'num_expert_group'"):
        ops.grouped_topk(g, 2, True, 5, 1)
    with pytest.raises(ValueError, match="'topk'"):
        ops.grouped_topk(g, 5, True, 4, 1)  # one group of 4 experts holds fewer than 5
    with pytest.raises(ValueError, match="'scoring_func'"):
        ops.grouped_topk(g, 2, True, 4, 2, "relu")
    with pytest.raises(ValueError, match="'e_score_correction_bias'"):
        ops.grouped_topk(g, 2, True, 4, 2, "sigmoid", 1.0, torch.zeros(8))


def _experts_args():
    x = torch.randn(3, 8)
    a, b = torch.randn(4, 12, 8), torch.randn(4, 8, 6)
    w, i = ops.topk_softmax(torch.randn(3, 4), 2, True)
    return {"hidden_states": x, "w13": a, "w2": b, "topk_weights": w, "topk_ids": i}


_EXPERTS_ARGS = ("hidden_states", "w13", "w2", "topk_weights", "topk_ids")


@pytest.mark.parametrize(
    "op,arg",
    [
        ("topk_softmax", "gating_output"),
        ("grouped_topk", "gating_output"),
        *[("fused_experts", a) for a in _EXPERTS_ARGS],
    ],
)
def test_none_in_a_required_tensor_is_a_type_error_naming_it(op, arg):
    # None skipped the non-tensor check (it is allowed for optional tensors), so the
    # validator re-raised the AttributeError of None.dtype
    a = {**_experts_args(), "gating_output": torch.randn(3, 16), arg: None}
    calls = {
        "topk_softmax": lambda: ops.topk_softmax(a["gating_output"], 2, True),
        "grouped_topk": lambda: ops.grouped_topk(a["gating_output"], 2, True, 4, 2),
        "fused_experts": lambda: ops.fused_experts(*(a[n] for n in _EXPERTS_ARGS)),
    }
    with pytest.raises(TypeError, match=f"{op}: argument '{arg}': expected a Tensor, got NoneType"):
        calls[op]()


def test_grouped_topk_names_e_score_correction_bias_when_it_is_not_a_tensor():
    # the message named it 'bias', which is no argument of the op
    g = torch.randn(3, 16)
    with pytest.raises(TypeError, match="argument 'e_score_correction_bias': expected a Tensor"):
        ops.grouped_topk(g, 2, True, 4, 2, "sigmoid", 1.0, [0.0] * 16)


def test_a_float_argument_of_the_wrong_rank_says_how_many_dims():
    # an exact rank read "expected 2 to 2"
    args = _experts_args()
    x = args.pop("hidden_states")
    with pytest.raises(ValueError, match=r"'hidden_states': has 3 dims .*; expected 2 dims$"):
        ops.fused_experts(x[None], **args)


def test_fused_experts_blames_the_argument_on_another_device():
    # ids on another device than hidden_states were reported as a bad 'topk_weights'
    # ("meta" stands for another device on a CPU-only machine)
    args = _experts_args()
    for arg in ("topk_ids", "topk_weights"):
        moved = {**args, arg: args[arg].to("meta")}
        with pytest.raises(ValueError, match=f"argument '{arg}': .* on meta; expected"):
            ops.fused_experts(**moved)


def test_fused_experts_refuses_cpu_ids_outside_the_experts():
    # an id of E indexed past w13 (IndexError) and a negative one failed in bincount
    # (RuntimeError); CPU ids are read for free, so they are checked
    args = _experts_args()
    ok = torch.tensor([[0, 3], [3, 3], [1, 0]], dtype=torch.int32)
    assert ops.fused_experts(**{**args, "topk_ids": ok}).shape == (3, 8)  # E - 1 is fine
    for bad in (4, -1, 1000):
        ids = ok.clone()
        ids[1, 0] = bad
        with pytest.raises(ValueError, match=rf"'topk_ids': holds {bad}, outside the 4 experts"):
            ops.fused_experts(**{**args, "topk_ids": ids})
    # more than 64 ids: the range comes from a reduction instead of a list, int64 alike
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 8, generator=g)
    w, ids = ops.topk_softmax(torch.randn(40, 4, generator=g), 2, True)
    ids = ids.long()
    ids[33, 1] = 4
    big = {**args, "hidden_states": x, "topk_weights": w, "topk_ids": ids}
    with pytest.raises(ValueError, match="'topk_ids': holds 4, outside the 4 experts"):
        ops.fused_experts(**big)


def test_fakes_and_opcheck_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        g = torch.empty(5, 32)
        w, i = ops.topk_softmax(g, 4, True)
        assert (w.shape, w.dtype, i.dtype) == ((5, 4), torch.float32, torch.int32)
        w, i = ops.grouped_topk(g, 4, True, 4, 2)
        assert i.shape == (5, 4)
        x = torch.empty(5, 8, dtype=torch.bfloat16)
        out = ops.fused_experts(
            x,
            torch.empty(32, 12, 8, dtype=torch.bfloat16),
            torch.empty(32, 8, 6, dtype=torch.bfloat16),
            w,
            i,
        )
        assert (out.shape, out.dtype) == ((5, 8), torch.bfloat16)
