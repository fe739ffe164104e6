"""opcore-plugin-rocm: its probe on this machine (no AMD GPU, CPU torch), its packaging and
the `RocmPlatform` contract. Tests that stand in for amdsmi or a ROCm torch say so in
their names."""

from __future__ import annotations

import importlib.metadata as md
import sys
import types

import pytest
import torch

import opcore_plugin_rocm
from opcore.kernels import TRITON_OPS
from opcore.platforms import Absent, Platform
from opcore.platforms.api_version import removed_members
from opcore_plugin_rocm.platform import RocmPlatform, fp8_for_arch
from opcore_plugin_rocm.probe import PLATFORM_CLASS, probe


@pytest.mark.skipif(getattr(torch.version, "hip", None) is not None, reason="ROCm torch")
def test_probe_is_absent_here_with_a_reason():
    result = probe()
    assert isinstance(result, Absent) and not result
    assert "amdsmi" in result.reason and "torch.version.hip" in result.reason


def _simulated_amdsmi(count: int) -> types.ModuleType:
    """A stand-in for amdsmi reporting ``count`` GPUs (no machine here has an AMD GPU)."""
    mod = types.ModuleType("amdsmi")
    mod.amdsmi_init = lambda: None
    mod.amdsmi_shut_down = lambda: None
    mod.amdsmi_get_processor_handles = lambda: [object()] * count
    return mod


def test_probe_with_simulated_amdsmi_and_simulated_rocm_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", _simulated_amdsmi(8))
    monkeypatch.setattr(torch.version, "hip", "7.0.0", raising=False)
    assert probe() == PLATFORM_CLASS == "opcore_plugin_rocm.platform.RocmPlatform"


def test_probe_with_simulated_amdsmi_refuses_a_cuda_or_cpu_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", _simulated_amdsmi(1))
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    result = probe()
    assert isinstance(result, Absent) and "not a ROCm build" in result.reason


def test_probe_with_simulated_amdsmi_zero_devices(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", _simulated_amdsmi(0))
    monkeypatch.setattr(torch.version, "hip", "7.0.0", raising=False)
    result = probe()
    assert isinstance(result, Absent) and "0 AMD GPUs" in result.reason


def test_probe_falls_back_to_simulated_rocm_torch_without_amdsmi(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # `import amdsmi` raises ImportError
    monkeypatch.setattr(torch.version, "hip", "7.0.0", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert probe() == PLATFORM_CLASS
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    result = probe()
    assert isinstance(result, Absent) and "amdsmi not installed" in result.reason


def test_entry_point_is_installed_and_discovered():
    eps = md.entry_points(group="opcore.intree_platform_plugins")
    (ep,) = [e for e in eps if e.name == "rocm"]
    assert ep.value == "opcore_plugin_rocm:probe"
    assert ep.dist is not None and ep.dist.name == "opcore-plugin-rocm"
    assert ep.load() is opcore_plugin_rocm.probe


def test_platform_identity():
    assert issubclass(RocmPlatform, Platform)
    p = RocmPlatform()
    assert p.name == "rocm" and p.device_type == "cuda" and p.dispatch_key == "CUDA"
    assert p.dist_backend == "nccl"
    assert p.device_control_env_var == "HIP_VISIBLE_DEVICES"
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


def test_fp8_by_architecture():
    assert fp8_for_arch("gfx942:sramecc+:xnack-") is torch.float8_e4m3fnuz
    assert fp8_for_arch("gfx950") is torch.float8_e4m3fn
    assert fp8_for_arch("gfx90a") is None
    assert fp8_for_arch(None) is None


def test_device_queries_are_answered_by_torch_cuda_through_the_shared_base():
    """A ROCm build of torch backs torch.cuda with HIP, so the shared base asks torch.cuda."""
    p = RocmPlatform()
    assert p.device_module() is torch.cuda
    assert p.device_count() == torch.cuda.device_count()


def test_graphs_captured_through_torch_cuda_where_torch_accelerator_has_no_graph():
    from opcore_plugin_rocm.platform import RocmPlatform

    graph_cls = RocmPlatform().graph_class()
    accel_graph = getattr(torch.accelerator, "Graph", None)
    current = torch.accelerator.current_accelerator()
    if accel_graph is not None and current is not None and current.type == "cuda":
        assert graph_cls is accel_graph
    else:
        assert graph_cls is torch.cuda.CUDAGraph
