"""opcore-plugin-xpu in the dev venv (a CPU build of torch, no Intel GPU, no IPEX).

Tests whose names say ``simulated`` replace ``torch.xpu``'s answers (or Triton's backend
list) for the duration of the test: no machine of this project has an Intel GPU.
"""

from __future__ import annotations

import importlib.metadata as md

import pytest
import torch
from packaging.requirements import Requirement

from opcore.platforms import Absent
from opcore.platforms.api_version import removed_members
from opcore.version_policy import requirement
from opcore_plugin_xpu import detect, probe
from opcore_plugin_xpu import platform as xpu_platform
from opcore_plugin_xpu.platform import XpuPlatform


def test_xpu_entry_point_is_installed_in_tree():
    eps = [ep for ep in md.entry_points(group="opcore.intree_platform_plugins") if ep.name == "xpu"]
    assert len(eps) == 1 and eps[0].value == "opcore_plugin_xpu:probe"
    requires = md.requires("opcore-plugin-xpu") or []
    # The one hard requirement is opcore, in the range the plugin API promises.
    assert [Requirement(r) for r in requires if "extra ==" not in r] == [Requirement(requirement())]


def test_xpu_probe_on_this_cpu_build_says_why():
    result = probe()
    assert isinstance(result, Absent)
    assert "built without XPU support" in result.reason
    assert torch.__version__ in result.reason


def test_xpu_probe_simulated_driver_without_device(monkeypatch):
    monkeypatch.setattr(torch.xpu, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    result = detect.probe()
    assert isinstance(result, Absent)
    assert "no Intel GPU was found" in result.reason and "ZE_AFFINITY_MASK" in result.reason


def test_xpu_probe_simulated_device_present(monkeypatch):
    monkeypatch.setattr(torch.xpu, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    assert detect.probe() == "opcore_plugin_xpu.platform.XpuPlatform"


def test_xpu_platform_identity():
    p = XpuPlatform()
    assert (p.name, p.device_type, p.dispatch_key) == ("xpu", "xpu", "XPU")
    assert p.dist_backend == "xccl"
    assert p.device_control_env_var == "ZE_AFFINITY_MASK"
    assert "plugin_api" in vars(type(p)) and p.plugin_api == ("2.0", "3.0")  # declared, API 2.0
    assert removed_members(type(p)) == {}  # nothing plugin API 2.0 removed


def test_xpu_defaults_name_only_usable_providers():
    p = XpuPlatform()
    p.import_ir_kernels()
    # Here: no IPEX, and Triton has no intel backend (only nvidia/amd).
    assert p.default_providers() == []
    assert p.get_default_ir_op_priority(None) == {}
    assert p.get_attn_backend_candidates(None) == ["TORCH_NATIVE"]


def test_xpu_defaults_simulated_intel_triton_backend(monkeypatch):
    monkeypatch.setattr(xpu_platform, "intel_triton_backend", lambda: True)
    p = XpuPlatform()
    p.import_ir_kernels()
    priority = p.get_default_ir_op_priority(None)
    from opcore.ir import all_ops

    with_triton = {name for name, op in all_ops().items() if "triton" in op.impls}
    assert {"rms_norm", "split_qkv_rmsnorm_rope"} <= with_triton
    assert set(priority) == with_triton
    assert all(chain == ["triton"] for chain in priority.values())
    assert p.get_attn_backend_candidates(None) == ["TRITON_PAGED", "TORCH_NATIVE"]


def test_xpu_ipex_provider_absent_here_and_declines_non_xpu_tensors():
    from opcore.ir import ops
    from opcore_plugin_xpu import ipex_provider

    if ipex_provider.REGISTERED:
        pytest.skip("IPEX is installed here")
    assert "intel_extension_for_pytorch" in ipex_provider.IMPORT_ERROR
    assert "ipex" not in ops.rms_norm.impls
    x = torch.randn(4, 64)
    assert ipex_provider.supports_rms_norm(x, torch.ones(64), 1e-6) is False
    assert ipex_provider.supports_silu_and_mul(x) is False


def test_xpu_device_queries_are_answered_by_torch_xpu_through_the_shared_base():
    """torch.xpu answers (this CPU build counts no XPU); the capability, which torch.xpu
    gives as a dict of features rather than (major, minor), is None as the interface says."""
    p = XpuPlatform()
    assert p.device_module() is torch.xpu
    assert p.device_count() == torch.xpu.device_count()
    assert p.get_device_capability(0) is None
