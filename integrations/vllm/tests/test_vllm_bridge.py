"""opcore-vllm against the real vLLM on its CPU platform (see conftest.py)."""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import opcore_vllm
import pytest
import torch
from opcore_vllm import _ir, _layers

import opcore.ir
from opcore.ir import ops
from opcore.testing.ir import temporary_op

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _vllm_op(name):
    from vllm.ir.op import IrOp

    return IrOp.registry[name]


def _assert_close(got, want, op, dtype):
    atol, rtol = op.tolerance(dtype)  # opcore's conformance budget for this op and dtype
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


# ------------------------------------------------------------------ loading and registration
def test_vllm_loads_the_bridge_through_its_general_plugins_entry_point():
    from vllm.plugins import load_plugins_by_group

    (ep,) = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "opcore"]
    assert ep.value == "opcore_vllm:register"
    assert ep.dist.name == "opcore-vllm"
    assert load_plugins_by_group("vllm.general_plugins")["opcore"] is opcore_vllm.register


def test_shared_ops_are_the_run_time_intersection(vllm_plugins_loaded):
    from vllm.ir.op import IrOp

    shared = sorted(set(IrOp.registry) & set(opcore.ir.all_ops()))
    assert "rms_norm" in shared and "fused_add_rms_norm" in shared
    assert "gelu_and_mul_sparse" not in shared  # vLLM's only; opcore has no such op
    assert sorted(vllm_plugins_loaded.providers) == shared
    for name in shared:
        oop, vop = opcore.ir.all_ops()[name], IrOp.registry[name]
        assert vllm_plugins_loaded.providers[name] == sorted(f"opcore_{p}" for p in oop.impls)
        for provider, impl in oop.impls.items():
            assert vop.impls[f"opcore_{provider}"].supported == bool(impl.supported)
    assert vllm_plugins_loaded.vllm_version == __import__("vllm").__version__


def test_vllm_compile_cache_key_follows_opcores_provider_identity():
    from vllm.config.kernel import IrOpPriorityConfig

    vop = _vllm_op("rms_norm")
    uuids = {p: vop.impls[f"opcore_{p}"].uuid() for p in ("native", "counting")}
    assert uuids["native"] != uuids["counting"]  # one adapter file, two opcore kernels
    assert uuids["native"] != vop.impls["native"].uuid()
    IrOpPriorityConfig(rms_norm=["opcore_native", "native"]).compute_hash()  # vLLM's use


def test_register_is_idempotent(vllm_plugins_loaded):
    assert opcore_vllm.register() is vllm_plugins_loaded
    import vllm.plugins

    vllm.plugins.load_general_plugins()  # a second load in one process changes nothing
    assert list(_vllm_op("rms_norm").impls).count("opcore_native") == 1


# ------------------------------------------------------------------ IR: vLLM's priority decides
def test_vllm_rms_norm_with_an_opcore_priority_calls_opcore(calls):
    vop = _vllm_op("rms_norm")
    x, w = torch.randn(4, 64), torch.randn(64)
    with vop.set_priority(["native"]):
        want = vop(x, w, 1e-6)
    assert calls["rms_norm"] == 0
    with vop.set_priority(["opcore_counting", "native"]):
        assert vop.dispatch(x, w, 1e-6).provider == "opcore_counting"
        got = vop(x, w, 1e-6)  # through vLLM's torch op (torch wrapping on)
    assert calls["rms_norm"] == 1
    torch.testing.assert_close(got, want)


def test_vllm_config_priority_routes_vllm_rmsnorm_layer_to_opcore(calls, vllm_config):
    from vllm.model_executor.layers.layernorm import RMSNorm

    prio = {"rms_norm": ["opcore_counting", "native"], "fused_add_rms_norm": ["opcore_counting"]}
    cfg, ctx = vllm_config(ir_op_priority=prio)
    # vLLM appended its platform default (native) after the user's list
    assert cfg.kernel_config.ir_op_priority.rms_norm == ["opcore_counting", "native"]
    with ctx:
        layer = RMSNorm(64, eps=1e-5)  # built after plugin loading
        x, r = torch.randn(3, 64), torch.randn(3, 64)
        with cfg.kernel_config.ir_op_priority.set_priority():  # what a vLLM worker installs
            out = layer(x)
            out2, res2 = layer(x.clone(), r.clone())
        assert (calls["rms_norm"], calls["fused_add_rms_norm"]) == (1, 1)
        # vLLM's own route when the config does not name opcore
        cfg_native, _ = vllm_config(ir_op_priority={"rms_norm": ["native"]})
        with cfg_native.kernel_config.ir_op_priority.set_priority():
            want = layer(x)
            want2, wres2 = layer(x.clone(), r.clone())
        assert (calls["rms_norm"], calls["fused_add_rms_norm"]) == (1, 1)
    _assert_close(out, want, ops.rms_norm, torch.float32)
    _assert_close(out2, want2, ops.fused_add_rms_norm, torch.float32)
    _assert_close(res2, wres2, ops.fused_add_rms_norm, torch.float32)


def test_opcore_vllm_priority_fills_vllms_ir_op_priority(monkeypatch, calls):
    from vllm.config.kernel import IrOpPriorityConfig

    assert opcore_vllm.ir_op_priority({}) == {}
    prio = opcore_vllm.ir_op_priority({"OPCORE_VLLM_PRIORITY": "counting"})
    assert prio == {
        "fused_add_rms_norm": ["opcore_counting", "native"],
        "rms_norm": ["opcore_counting", "native"],
    }
    config = IrOpPriorityConfig(**prio)  # vLLM takes it as its ir_op_priority
    with config.set_priority():
        _vllm_op("rms_norm")(torch.randn(2, 8), None, 1e-6)
    assert calls["rms_norm"] == 1
    monkeypatch.setenv("OPCORE_VLLM_PRIORITY", "opcore_native")
    out = subprocess.run(
        [sys.executable, "-m", "opcore_vllm", "ir-op-priority"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OPCORE_VLLM_LAYERS": ""},
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["rms_norm"] == [
        "opcore_native",
        "native",
    ]


# ------------------------------------------------------------------ semantic differences, pinned
def test_epsilon_of_another_number_type_is_given_to_opcore_as_a_python_float(calls):
    import vllm.ir

    vop = _vllm_op("rms_norm")
    x, w = torch.randn(2, 16), torch.randn(16)
    eps = np.float32(1e-5)
    with pytest.raises(Exception, match="epsilon"):
        ops.rms_norm(x, w, eps)  # opcore alone refuses a NumPy scalar
    with vllm.ir.enable_torch_wrap(False), vop.set_priority(["opcore_counting", "native"]):
        assert vop.dispatch(x, w, eps).provider == "opcore_counting"
        got = vop(x, w, eps)
    eps_types = {k: v for k, v in calls.items() if "epsilon" in k}
    assert eps_types == {"rms_norm epsilon float": 1}
    torch.testing.assert_close(got, vop.impls["native"].impl_fn(x, w, float(eps)))


def test_weight_dtype_vllm_accepts_and_opcore_refuses_falls_through_to_vllm_native(calls):
    vop = _vllm_op("rms_norm")
    x, w = torch.randn(2, 16, dtype=torch.bfloat16), torch.randn(16)  # fp32 weight
    vop.impls["native"].impl_fn(x, w, 1e-6)  # vLLM's own op takes it
    with pytest.raises(Exception, match="weight"):
        ops.rms_norm(x, w, 1e-6)  # opcore requires the activation's dtype
    with vop.set_priority(["opcore_counting", "native"]):
        assert vop.dispatch(x, w, 1e-6).provider == "native"
        vop(x, w, 1e-6)
    assert calls["rms_norm"] == 0


def test_in_place_forms_map_onto_vllms_maybe_inplace(calls):
    vop = _vllm_op("fused_add_rms_norm")
    # opcore's in-place provider is an in-place vLLM provider; its native one is not
    assert vop.impls["opcore_counting"].inplace is True
    assert vop.impls["opcore_native"].inplace is False
    x, r, w = torch.randn(3, 32), torch.randn(3, 32), torch.randn(32)
    want_out, want_res = vop.impls["native"].impl_fn(x, r, w, 1e-6)
    x0, r0 = x.clone(), r.clone()
    with vop.set_priority(["opcore_counting", "native"]):
        out, res = vop(x, r, w, 1e-6)  # default overload: functional
        assert torch.equal(x, x0) and torch.equal(r, r0)
        out2, res2 = vop.maybe_inplace(x, r, w, 1e-6)  # donated: written in place
    assert calls["fused_add_rms_norm"] == 2
    assert out2.data_ptr() == x.data_ptr() and res2.data_ptr() == r.data_ptr()
    for got in (out, out2):
        _assert_close(got, want_out, ops.fused_add_rms_norm, torch.float32)
    for got in (res, res2):
        _assert_close(got, want_res, ops.fused_add_rms_norm, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variance_size", [None, 48])
@pytest.mark.parametrize("with_weight", [True, False])
def test_opcore_native_matches_vllm_native_within_the_budgets(dtype, variance_size, with_weight):
    torch.manual_seed(0)
    x, r = torch.randn(7, 64, dtype=dtype), torch.randn(7, 64, dtype=dtype)
    w = torch.randn(64, dtype=dtype) if with_weight else None
    v = _vllm_op("rms_norm")
    with v.set_priority(["opcore_native", "native"]):
        assert v.dispatch(x, w, 1e-6, variance_size).provider == "opcore_native"
        got = v(x, w, 1e-6, variance_size)
    _assert_close(got, v.impls["native"].impl_fn(x, w, 1e-6, variance_size), ops.rms_norm, dtype)
    f = _vllm_op("fused_add_rms_norm")
    with f.set_priority(["opcore_native", "native"]):
        got_o, got_r = f(x, r, w, 1e-6, variance_size)
    want_o, want_r = f.impls["native"].impl_fn(x, r, w, 1e-6, variance_size)
    _assert_close(got_o, want_o, ops.fused_add_rms_norm, dtype)
    _assert_close(got_r, want_r, ops.fused_add_rms_norm, dtype)


# ------------------------------------------------------------------ layers: register_oot
def _rope(dtype=torch.float32, head_size=64, rotary_dim=64, neox=True):
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    return RotaryEmbedding(head_size, rotary_dim, 256, 10000.0, neox, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_vllm_rotary_embedding_uses_opcore_when_enabled(
    calls, vllm_config, dtype, neox, rotary_dim
):
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    _, ctx = vllm_config(custom_ops=["all"])  # vLLM's custom op route enabled
    with ctx:
        layer = _rope(dtype, 64, rotary_dim, neox)
        assert type(layer).__name__ == "OpcoreRotaryEmbedding" and isinstance(
            layer, RotaryEmbedding
        )
        assert layer._forward_method.__func__.__name__ == "opcore_forward"
        pos = torch.randint(0, 256, (9,))
        q, k = torch.randn(9, 4 * 64, dtype=dtype), torch.randn(9, 2 * 64, dtype=dtype)
        want_q, want_k = layer.forward_native(pos, q.clone(), k.clone())  # vLLM's own
        with ops.rotary_embedding.set_priority(["counting"]):  # opcore's config picks inside
            got_q, got_k = layer(pos, q, k)
    assert calls["rotary_embedding"] == 1
    assert got_q is q and got_k is k  # in place, like vLLM's kernel route
    _assert_close(got_q, want_q, ops.rotary_embedding, dtype)
    _assert_close(got_k, want_k, ops.rotary_embedding, dtype)


def test_vllm_rotary_embedding_is_vllms_own_when_the_custom_op_is_off(calls, vllm_config):
    _, ctx = vllm_config(custom_ops=["all", "-rotary_embedding"])
    with ctx:
        layer = _rope()
        assert layer.enabled() is False  # vLLM's config speaks the op's own name
        assert layer._forward_method.__func__.__name__ == "forward_native"
        pos, q, k = torch.arange(5), torch.randn(5, 128), torch.randn(5, 128)
        with ops.rotary_embedding.set_priority(["counting"]):
            layer(pos, q, k)
    assert calls["rotary_embedding"] == 0


def test_rotary_key_none_and_arguments_opcore_refuses(calls, vllm_config):
    _, ctx = vllm_config(custom_ops=["all"])
    with ctx:
        layer = _rope(head_size=64, rotary_dim=64)
        pos, q = torch.arange(4), torch.randn(4, 128)
        want_q, _ = layer.forward_native(pos, q.clone(), None)
        with ops.rotary_embedding.set_priority(["counting"]):
            got_q, got_k = layer(pos, q, None)
            assert got_k is None and calls["rotary_embedding"] == 1
            _assert_close(got_q, want_q, ops.rotary_embedding, torch.float32)
            # positions past the cache: opcore's validator refuses, vLLM's own code runs
            bad = torch.tensor([300])
            with pytest.raises(ValueError):
                ops.rotary_embedding(bad, q[:1], None, 64, layer.cos_sin_cache, True)
            with pytest.raises(IndexError):
                layer(bad, q[:1].clone(), None)  # vLLM's forward_native's own error
    assert calls["rotary_embedding"] == 1


# ------------------------------------------------------------------ refusals
def test_a_layer_adapter_written_for_another_vllm_refuses_in_one_line():
    from vllm.model_executor.custom_op import op_registry_oot

    before = dict(op_registry_oot)
    old = dataclasses.replace(
        _layers.ROTARY,
        name="rotary_embedding_old",
        init=_layers.ROTARY.init[:-1],  # as if vLLM's __init__ had no init_cache
    )
    rep = opcore_vllm.Report()
    os.environ["OPCORE_VLLM_LAYERS"] = "all,rotary_embedding_old"
    try:
        _layers.register_layers(rep, adapters=(old,))
    finally:
        os.environ["OPCORE_VLLM_LAYERS"] = "all"
    line = rep.refused["layer.rotary_embedding_old"]
    assert "\n" not in line and "init_cache=True" in line
    assert line.endswith(f"(opcore-vllm supports vLLM {opcore_vllm.VLLM_RANGE})")
    assert "rotary_embedding_old" not in rep.layers
    assert op_registry_oot == before  # nothing replaced


def test_an_ir_op_with_other_parameters_refuses_and_vllm_keeps_its_own():
    vop = _vllm_op("gelu_and_mul_sparse")  # vLLM: (x, std_multiplier, approximate="none")
    before = dict(vop.impls)

    def gelu_and_mul_sparse(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        return x

    with temporary_op(gelu_and_mul_sparse):
        rep = opcore_vllm.Report()
        _ir.register_ir(rep)
    line = rep.refused["ir.gelu_and_mul_sparse"]
    assert "\n" not in line and "std_multiplier" in line and opcore_vllm.VLLM_RANGE in line
    assert "gelu_and_mul_sparse" not in rep.providers
    assert vop.impls == before
    assert sorted(rep.providers) == ["fused_add_rms_norm", "rms_norm"]  # the others still fit


def test_a_vllm_outside_the_range_gets_nothing_registered():
    from vllm.model_executor.custom_op import op_registry_oot

    impls, oot = dict(_vllm_op("rms_norm").impls), dict(op_registry_oot)
    rep = opcore_vllm.build_report("0.34.0")
    assert rep.providers == {} and rep.layers == {}
    assert list(rep.refused) == ["bridge"]
    assert rep.refused["bridge"] == (
        "vLLM 0.34.0 is outside the range the adapters fit (opcore-vllm supports vLLM >=0.33,<0.34)"
    )
    assert dict(_vllm_op("rms_norm").impls) == impls and dict(op_registry_oot) == oot


def test_opcore_layers_without_a_vllm_class_are_listed_as_refused(vllm_plugins_loaded):
    refused = vllm_plugins_loaded.refused
    assert "compilation pass" in refused["layer.split_qkv_rmsnorm_rope"]
    assert "FusedMoE" in refused["layer.fused_moe"]
    assert vllm_plugins_loaded.layers == {"rotary_embedding": "registered (OpcoreRotaryEmbedding)"}


# ------------------------------------------------------------------ reporting
def test_opcore_info_gains_a_vllm_section(vllm_plugins_loaded):
    from opcore.cli import info

    data = info.collect()
    assert data["error"] is None
    section = data["vllm"]
    assert section["vllm_version"] == vllm_plugins_loaded.vllm_version
    assert section["providers"]["rms_norm"] == ["opcore_counting", "opcore_native"]
    assert "layer.fused_moe" in section["refused"]
    assert "vllm:" in info.render(data)


SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.ir.op import IrOp
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
    cfg = VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"]))
    with set_current_vllm_config(cfg):
        layer = RotaryEmbedding(64, 64, 128, 10000.0, True, torch.float32)
    op = IrOp.registry["rms_norm"]
    with op.set_priority(["opcore_native", "native"]):
        op(torch.randn(3, 32), torch.randn(32), 1e-6)
    print(json.dumps({"layer": type(layer).__name__, "oot": sorted(op_registry_oot)}))
    """
)


def test_without_opcore_vllm_layers_vllm_builds_its_own_and_dispatch_is_logged():
    env = {**os.environ, "OPCORE_LOG_DISPATCH": "1", "VLLM_TARGET_DEVICE": "cpu"}
    env.pop("OPCORE_VLLM_LAYERS")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"layer": "RotaryEmbedding", "oot": []}
    # opcore's dispatch log shows the vLLM call landing in opcore (provider native)
    assert "opcore.ir.dispatch: rms_norm(" in out.stderr and "-> native" in out.stderr
    info = subprocess.run(
        [sys.executable, "-m", "opcore", "info", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert info.returncode == 0, info.stderr
    section = json.loads(info.stdout)["vllm"]
    assert section["layers"]["rotary_embedding"].startswith("available, off")
    assert section["providers"]["rms_norm"] == ["opcore_native"]
