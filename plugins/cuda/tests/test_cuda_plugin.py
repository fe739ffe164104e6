"""opcore-plugin-cuda: its probe on this machine (no NVIDIA GPU), its packaging, and the
`CudaPlatform` contract. Tests that stand in for the NVML library say so in their names."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import types

import pytest
import torch

import opcore_plugin_cuda
from opcore.kernels import TRITON_OPS
from opcore.platforms import Absent, Platform
from opcore.platforms.api_version import removed_members
from opcore_plugin_cuda.platform import (
    CudaPlatform,
    dtypes_for_capability,
    fp8_for_capability,
    tensor_descriptor_copies_for_capability,
)
from opcore_plugin_cuda.probe import PLATFORM_CLASS, probe

HAS_NVIDIA_GPU = os.path.exists("/dev/nvidiactl")


@pytest.mark.skipif(HAS_NVIDIA_GPU, reason="this machine has an NVIDIA driver")
def test_probe_is_absent_here_with_the_nvml_reason():
    result = probe()
    assert isinstance(result, Absent) and not result
    assert "NVML" in result.reason or "pynvml" in result.reason


def test_probe_without_pynvml_simulated_missing_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    result = probe()
    assert isinstance(result, Absent)
    assert "nvidia-ml-py (pynvml) is not installed" in result.reason


def _simulated_nvml(count: int, calls: list[str]) -> types.ModuleType:
    """A stand-in for pynvml reporting ``count`` GPUs (no machine here has an NVIDIA GPU)."""
    mod = types.ModuleType("pynvml")
    mod.nvmlInit = lambda: calls.append("init")
    mod.nvmlShutdown = lambda: calls.append("shutdown")
    mod.nvmlDeviceGetCount = lambda: count
    return mod


def test_probe_with_simulated_nvml_devices(monkeypatch):
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _simulated_nvml(2, calls))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert probe() == PLATFORM_CLASS == "opcore_plugin_cuda.platform.CudaPlatform"
    assert calls == ["init", "shutdown"]  # NVML is released again


def test_probe_with_simulated_nvml_zero_devices(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _simulated_nvml(0, []))
    result = probe()
    assert isinstance(result, Absent) and "0 NVIDIA GPUs" in result.reason


def test_probe_with_simulated_nvml_refuses_a_cpu_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _simulated_nvml(1, []))
    monkeypatch.setattr(torch.version, "cuda", None)
    result = probe()
    assert isinstance(result, Absent) and "built without CUDA" in result.reason


def test_probe_is_pure():
    code = (
        "import sys, opcore_plugin_cuda as c; c.probe(); c.probe();"
        "assert 'opcore_plugin_cuda.platform' not in sys.modules;"
        "assert 'opcore.kernels.triton' not in sys.modules;"
        "assert 'opcore.platforms' in sys.modules;"
        "assert sys.modules['opcore.platforms']._decision is None;"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_entry_point_is_installed_and_discovered():
    eps = md.entry_points(group="opcore.intree_platform_plugins")
    (ep,) = [e for e in eps if e.name == "cuda"]
    assert ep.value == "opcore_plugin_cuda:probe"
    assert ep.dist is not None and ep.dist.name == "opcore-plugin-cuda"
    assert ep.load() is opcore_plugin_cuda.probe
    requires = md.requires("opcore-plugin-cuda") or []
    assert any(r.startswith("nvidia-ml-py") for r in requires)
    assert any(r.startswith("opcore") for r in requires)


@pytest.mark.skipif(HAS_NVIDIA_GPU, reason="this machine has an NVIDIA driver")
def test_forcing_the_cuda_platform_here_fails_with_the_probe_reason():
    env = {**os.environ, "OPCORE_PLATFORM": "cuda"}
    code = "import opcore.platforms as p; p.get_current_platform()"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode != 0
    assert "cuda" in out.stderr and "NVML" in out.stderr


def test_platform_identity():
    assert issubclass(CudaPlatform, Platform)
    p = CudaPlatform()  # every abstract member is answered
    assert p.name == "cuda" and p.device_type == "cuda" and p.dispatch_key == "CUDA"
    assert p.dist_backend == "nccl"
    assert p.device_control_env_var == "CUDA_VISIBLE_DEVICES"
    assert "plugin_api" in vars(type(p)) and p.plugin_api == ("2.0", "3.0")  # declared, API 2.0
    assert removed_members(type(p)) == {}  # nothing plugin API 2.0 removed
    assert p.get_attn_backend_candidates(None) == ["TRITON_PAGED", "TORCH_NATIVE"]
    # the norms' batch-invariant variant after triton (docs/properties.md)
    invariant = {"rms_norm", "fused_add_rms_norm", "split_qkv_rmsnorm_rope"}
    assert p.get_default_ir_op_priority(None) == {
        op: ["triton", "triton_batch_invariant", "native"]
        if op in invariant
        else ["triton", "native"]
        for op in TRITON_OPS
    }
    assert set(TRITON_OPS) == {
        "rms_norm",
        "fused_add_rms_norm",
        "silu_and_mul",
        "gelu_and_mul",
        "rotary_embedding",
        "split_qkv_rmsnorm_rope",
        "scaled_fp8_quant",
        "dynamic_per_token_scaled_fp8_quant",
        "per_token_group_quant_fp8",
        "rms_norm_static_fp8_quant",
        "fused_add_rms_norm_static_fp8_quant",
        "rms_norm_dynamic_per_token_quant",
        "silu_and_mul_fp8_quant",
        "silu_and_mul_per_token_group_fp8_quant",
        "topk_softmax",
        "grouped_topk",
        "fused_experts",
    }


def test_dtypes_by_capability():
    assert torch.bfloat16 not in dtypes_for_capability((7, 5))
    assert dtypes_for_capability((9, 0)) == (torch.float32, torch.float16, torch.bfloat16)
    assert fp8_for_capability((8, 0)) is None
    assert fp8_for_capability((8, 9)) is torch.float8_e4m3fn
    assert fp8_for_capability((9, 0)) is torch.float8_e4m3fn
    assert fp8_for_capability(None) is None


def test_tensor_descriptor_copies_from_hopper_on():
    # TRITON_PAGED's prefill reads key tiles through descriptors where this says the TMA
    # copies them (sm90 on); the platform answers for a device from its capability, and
    # a platform that says nothing keeps the pointer loads.
    assert tensor_descriptor_copies_for_capability((9, 0)) is True
    assert tensor_descriptor_copies_for_capability((10, 0)) is True
    assert tensor_descriptor_copies_for_capability((8, 9)) is False
    assert tensor_descriptor_copies_for_capability(None) is False
    assert "tensor_descriptor_copies" in vars(CudaPlatform)


def test_import_ir_kernels_registers_triton_on_the_six_ops():
    # In a child: importing the kernels here would build them for the GPU in this process.
    code = (
        "from opcore.kernels import TRITON_OPS;"
        "from opcore_plugin_cuda.platform import CudaPlatform;"
        "CudaPlatform().import_ir_kernels();"
        "from opcore.ir import all_ops;"
        "registered = sorted(n for n, op in all_ops().items() if 'triton' in op.impls);"
        "assert registered == sorted(TRITON_OPS), registered;"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch")
def test_device_queries_are_answered_by_torch_cuda_through_the_shared_base():
    """No copy of the queries in the plugin: `TorchDevicePlatform` asks torch.cuda. On this
    CPU build torch.cuda counts no device, and a per-device query raises torch's own error."""
    p = CudaPlatform()
    assert p.device_module() is torch.cuda
    assert p.device_count() == 0
    with pytest.raises(AssertionError, match="not compiled with CUDA"):
        p.get_device_name(0)


def test_graphs_captured_through_torch_cuda_where_torch_accelerator_has_no_graph():
    # `opcore bench` times decode sizes by graph replay (Platform.capture_graph). Where torch
    # has no torch.accelerator.Graph for this device (torch 2.11, or a build whose accelerator
    # is not CUDA, like this CPU machine's) the platform must still name a graph class.
    from opcore_plugin_cuda.platform import CudaPlatform

    graph_cls = CudaPlatform().graph_class()
    accel_graph = getattr(torch.accelerator, "Graph", None)
    current = torch.accelerator.current_accelerator()
    if accel_graph is not None and current is not None and current.type == "cuda":
        assert graph_cls is accel_graph
    else:
        assert graph_cls is torch.cuda.CUDAGraph
