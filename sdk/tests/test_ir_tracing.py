"""Traced calls are one opaque opcore_ir node; opcheck passes on every op."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from opcore.ir import all_ops, ops


def _opcore_nodes(graph):
    return [
        n.target for n in graph.nodes if n.op == "call_function" and "opcore_ir" in str(n.target)
    ]


def _model(x, w):
    return ops.rms_norm(x, w, 1e-6) * 2


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_make_fx_one_node(mode):
    x, w = torch.randn(4, 8), torch.rand(8)
    g = make_fx(_model, tracing_mode=mode)(x, w)
    assert _opcore_nodes(g.graph) == [torch.ops.opcore_ir.rms_norm.default]
    assert not any("pow" in str(n.target) or "rsqrt" in str(n.target) for n in g.graph.nodes)
    torch.testing.assert_close(g(x, w), _model(x, w))


def test_fx_symbolic_trace_one_node_with_parameter_weight():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.rand(8))

        def forward(self, x):
            return ops.rms_norm(x, self.w, 1e-6)

    m = M()
    gm = torch.fx.symbolic_trace(m)
    assert _opcore_nodes(gm.graph) == [torch.ops.opcore_ir.rms_norm.default]
    x = torch.randn(3, 8)
    torch.testing.assert_close(gm(x), m(x))


def test_torch_compile_graph_has_one_node_and_matches():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    x, w = torch.randn(4, 8), torch.rand(8)
    compiled = torch.compile(_model, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), _model(x, w))
    assert _opcore_nodes(graphs[0].graph) == [torch.ops.opcore_ir.rms_norm.default]


def test_torch_compile_aot_runs_rotary_without_key():
    sample = next(s for s in ops.rotary_embedding.sample_inputs() if s.name.startswith("key_none"))
    fn = torch.compile(lambda *a: ops.rotary_embedding(*a), fullgraph=True, backend="aot_eager")
    q, k = fn(*sample.args)
    assert k is None
    torch.testing.assert_close(q, ops.rotary_embedding.native(*sample.args)[0])


# Representative samples per op keep opcheck (slow: it traces with AOTAutograd) in budget;
# the conformance suite runs it over every sample.
_OPCHECK_SAMPLES = {
    "topk_softmax": ["t7_e64_k6_renorm", "ties_t6_e16_k4"],
    "grouped_topk": ["t5_e256_g8_tg4_k8_sigmoid_bias", "t4_e64_g8_tg3_k6_softmax"],
    "fused_experts": ["t7_e16_used8_k2_h48_i40_silu", "t4_e8_used6_k1_h40_i24_silu_on_input"],
    "rms_norm": [
        "t5_h33",
        "strided_rows_t6_h96",
        "weight_none_t4_h48",
        "variance_size_t4_h64_v32",
        "4d_2x2x3x40",
    ],
    "fused_add_rms_norm": ["t1_h8", "strided_rows_t6_h96"],
    "silu_and_mul": ["t5_d7", "strided_rows_t6_d48", "3d_2x3x64"],
    "gelu_and_mul": ["t5_d7_tanh", "4d_2x2x3x40"],
    "rotary_embedding": ["key_none_t5_h4_d64_neox", "batch_4d_2x3_h2_kv1_d64_gptj"],
    "split_qkv_rmsnorm_rope": ["strided_rows_t6_h4_kv2_d64_neox"],
    "scaled_fp8_quant": ["strided_rows_t6_h96", "scale_0d_t3_h24"],
    "dynamic_per_token_scaled_fp8_quant": ["3d_2x3x64", "scale_ub_saturating_t6_h64"],
    "per_token_group_quant_fp8": ["3d_2x3x256_g64_column_major", "defaults_kwargs_t3_h256"],
    "rms_norm_static_fp8_quant": ["strided_rows_t6_h96", "eps_1e-2_kwargs"],
    "fused_add_rms_norm_static_fp8_quant": ["weight_none_t4_h48"],
    "rms_norm_dynamic_per_token_quant": ["t5_h33", "scale_ub_residual_kwargs_t6_h64"],
    "silu_and_mul_fp8_quant": ["strided_rows_t6_d48"],
    "silu_and_mul_per_token_group_fp8_quant": ["3d_2x3x256_g64", "default_group_t3_d256"],
}


def test_opcheck_covers_every_op():
    assert set(_OPCHECK_SAMPLES) == set(all_ops())


@pytest.mark.parametrize("op_name", sorted(_OPCHECK_SAMPLES))
def test_opcheck(op_name):
    op = all_ops()[op_name]
    samples = {s.name: s for s in op.sample_inputs()}
    for i, name in enumerate(_OPCHECK_SAMPLES[op_name]):
        s = samples[name]
        torch.library.opcheck(op.torch_op, s.args, s.kwargs)
        if op.allow_inplace and i == 0:
            torch.library.opcheck(op.torch_op_inplace, s.args, s.kwargs)
