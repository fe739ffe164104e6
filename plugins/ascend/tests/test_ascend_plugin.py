"""opcore-plugin-ascend in the dev venv: packaging, probe, platform, providers, layers.

No machine of this project has an Ascend NPU or the CANN runtime, and torch_npu is not
installed in the dev venv. Tests whose names say ``simulated`` put a stand-in
``torch_npu`` module on the path (written by the test, never shipped) and give torch a
stand-in ``torch.npu`` namespace, to exercise the activation path; everything they run on
tensors runs on the CPU.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from packaging.requirements import Requirement

from opcore.platforms import Absent
from opcore.platforms.api_version import removed_members
from opcore.version_policy import requirement
from opcore_plugin_ascend import detect
from opcore_plugin_ascend.platform import AscendPlatform

HAS_TORCH_NPU = importlib.util.find_spec("torch_npu") is not None


def test_ascend_entry_points_are_out_of_tree_and_runtime_is_an_extra():
    eps = {
        (ep.group, ep.name): ep.value for ep in md.distribution("opcore-plugin-ascend").entry_points
    }
    # One entry point, out of tree; nothing runs in processes where the platform is
    # inactive (no general plugin).
    assert eps == {("opcore.platform_plugins", "ascend"): "opcore_plugin_ascend:probe"}
    requires = md.requires("opcore-plugin-ascend") or []
    # The one hard requirement is opcore, in the range the plugin API promises.
    assert [Requirement(r) for r in requires if "extra ==" not in r] == [Requirement(requirement())]
    assert any(r.startswith("torch-npu") and 'extra == "npu"' in r for r in requires)


@pytest.mark.skipif(HAS_TORCH_NPU, reason="torch_npu is installed here")
def test_ascend_probe_without_torch_npu_says_not_installed():
    result = detect.probe()
    assert isinstance(result, Absent)
    assert result.reason.startswith("torch_npu is not installed")


@pytest.fixture
def fake_torch_npu(tmp_path, monkeypatch):
    """Simulated torch_npu: a module whose body the test chooses."""

    def make(body: str):
        (tmp_path / "torch_npu.py").write_text(textwrap.dedent(body))
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
        importlib.invalidate_caches()

    yield make
    sys.modules.pop("torch_npu", None)


def test_ascend_probe_simulated_torch_npu_without_cann_keeps_error_and_env(
    fake_torch_npu, monkeypatch
):
    # What torch_npu 2.13 does on a host without CANN: it sets the autoload variable,
    # then its C extension fails to load (see reports/probe-without-cann.md).
    fake_torch_npu(
        """
        import os
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
        """
    )
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    result = detect.probe()
    assert isinstance(result, Absent)
    assert result.reason == (
        "torch_npu failed to import: ImportError: libhccl.so: cannot open shared object "
        "file: No such file or directory"
    )
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in os.environ


def test_ascend_probe_simulated_torch_npu_without_device(fake_torch_npu, monkeypatch):
    fake_torch_npu("")
    monkeypatch.setattr(
        torch,
        "npu",
        types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0),
        raising=False,
    )
    result = detect.probe()
    assert isinstance(result, Absent) and "is_available() is False" in result.reason


def test_ascend_probe_simulated_npu_present(fake_torch_npu, monkeypatch):
    fake_torch_npu("")
    monkeypatch.setattr(
        torch,
        "npu",
        types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 8),
        raising=False,
    )
    assert detect.probe() == "opcore_plugin_ascend.platform.AscendPlatform"


def test_ascend_platform_identity_and_defaults():
    p = AscendPlatform()
    assert (p.name, p.device_type, p.dispatch_key) == ("ascend", "npu", "PrivateUse1")
    assert (p.dist_backend, p.device_control_env_var) == ("hccl", "ASCEND_RT_VISIBLE_DEVICES")
    assert "plugin_api" in vars(type(p)) and p.plugin_api == ("2.0", "3.0")  # declared, API 2.0
    assert removed_members(type(p)) == {}  # nothing plugin API 2.0 removed
    priority = p.get_default_ir_op_priority(None)
    assert priority["rms_norm"] == ["npu"] and priority["split_qkv_rmsnorm_rope"] == [
        "ascend_triton"
    ]
    assert p.get_attn_backend_candidates(None) == ["ASCEND", "TORCH_NATIVE"]


def test_ascend_attention_backend_registered_by_name_and_explains_absence():
    from opcore.attention import AttentionSelectorConfig, UnknownBackendError, backend_class_path
    from opcore.attention.registry import load_backend_class
    from opcore.testing.attention import unregister_backend

    p = AscendPlatform()
    assert not hasattr(p, "get_attn_backend_cls")  # removed in plugin API 2.0: the registry maps
    from opcore.layers import RMSNorm, registered_layers
    from opcore.layers.attention import Attention

    with pytest.raises(UnknownBackendError):  # the core reserves no vendor name
        backend_class_path("ASCEND")
    p.import_kernels()  # what the core calls once the platform is active
    try:
        assert backend_class_path("ASCEND") == "opcore_plugin_ascend.attention.AscendBackend"
        assert registered_layers()["rms_norm"] == (RMSNorm, None)  # kernels are providers
    finally:
        unregister_backend("ASCEND")
        Attention.unregister_oot()
    cls = load_backend_class("opcore_plugin_ascend.attention.AscendBackend")
    cfg = AttentionSelectorConfig(
        head_size=128,
        num_heads=8,
        num_kv_heads=2,
        dtype=torch.bfloat16,
        block_size=128,
        device_type="cpu",
    )
    reasons = cls.validate_configuration(cfg)
    assert any(r.startswith("no usable NPU: torch_npu") for r in reasons)
    assert any("device type 'cpu'" in r for r in reasons)
    assert cls.supports_block_size(64) and not cls.supports_block_size(16)


def test_ascend_npu_provider_registers_unsupported_without_torch_npu():
    from opcore.ir import ops

    sys.modules.pop("opcore_plugin_ascend.npu_provider", None)
    names = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding")
    try:
        from opcore_plugin_ascend import npu_provider

        if HAS_TORCH_NPU:
            pytest.skip("torch_npu is installed here")
        assert npu_provider.SUPPORTED is False
        assert "torch_npu" in npu_provider.IMPORT_ERROR
        for name in names:
            impl = getattr(ops, name).impls["npu"]
            assert impl.supported is False
        # torch_npu has no fp8 quantization with the ops' semantics: no npu provider there
        assert npu_provider.FP8_QUANT_OPS == ()
        ends = ("fp8_quant", "per_token_quant", "quant_fp8")
        fp8_ops = [n for n in ops.__all__ if n.endswith(ends)]
        assert len(fp8_ops) == 8 and all("npu" not in getattr(ops, n).impls for n in fp8_ops)
        assert AscendPlatform.fp8_dtype is None and AscendPlatform.supported_quantization == ()
        assert not set(fp8_ops) & set(AscendPlatform().get_default_ir_op_priority(None))
        x = torch.randn(4, 64)
        assert npu_provider.supports_rms_norm(x, torch.ones(64), 1e-6) is False  # CPU tensors
        assert ops.rms_norm.dispatch(x, torch.ones(64), 1e-6).provider != "npu"
    finally:
        for name in names:
            op = getattr(ops, name)
            if "npu" in op.impls:
                op.unregister_impl("npu")
        sys.modules.pop("opcore_plugin_ascend.npu_provider", None)


_ACTIVE_SCRIPT = r"""
import json, os, sys, types
import torch
torch.npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1)
from opcore import platforms
from opcore.layers import RMSNorm
from opcore.layers.attention import Attention
decision = platforms.explain()
platform = decision.platform
platform.import_kernels()
norm = RMSNorm(64, eps=1e-6)
x = torch.randn(3, 64)
out = norm(x)
ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
from opcore.layers import binding_info
print(json.dumps({
    "platform": platform.name, "rule": decision.rule, "overridden": decision.overridden,
    "class": type(norm).__name__, "method": norm.bound_method,
    "route": binding_info()["registry"]["rms_norm"]["route"],
    "provider": __import__("opcore.ir", fromlist=["ops"]).ops.rms_norm.dispatch(
        x, norm.weight, 1e-6).provider,
    "close": bool(torch.allclose(out, ref, atol=1e-5)),
    "attention_oot": Attention.__new__(Attention).__class__.__name__,
}))
"""


def _run_active(tmp_path):
    (tmp_path / "torch_npu.py").write_text("# simulated torch_npu: imports, has no kernels\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _ACTIVE_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ascend_simulated_active_wins_out_of_tree_and_replaces_layers(tmp_path):
    got = _run_active(tmp_path)
    assert got["platform"] == "ascend"
    assert got["rule"] == "4" and "cpu" in got["overridden"]
    # RMSNorm is not replaced: its forward_native reaches the npu provider by priority,
    # which declines CPU tensors (the simulated torch_npu has no kernels), so native runs.
    assert got["class"] == "RMSNorm" and got["method"] == "forward_native"
    assert got["route"].startswith("forward_native -> op rms_norm")
    assert got["provider"] == "native"
    assert got["close"]
    assert got["attention_oot"] == "AscendAttention"


_QUERIES_SCRIPT = r"""
import json
import torch
from opcore_plugin_ascend.platform import AscendPlatform
assert "torch_npu" not in __import__("sys").modules
p = AscendPlatform()
torch.manual_seed(1)
p.manual_seed_all(5)
print(json.dumps({
    "count": p.device_count(), "name": p.get_device_name(1),
    "memory": p.get_device_total_memory(1), "capability": p.get_device_capability(0),
    "host_seed": torch.initial_seed(), "calls": torch.npu.calls,
}))
"""

# What torch_npu does on import, reduced to what the device queries need: name the
# PrivateUse1 backend "npu" and register torch.npu.
_SIMULATED_TORCH_NPU = """
import types
import torch
calls = []
def _record(name, answer):
    def fn(*args):
        calls.append([name, *args])
        return answer(*args)
    return fn
torch.utils.rename_privateuse1_backend("npu")
torch._register_device_module("npu", types.SimpleNamespace(
    calls=calls,
    device_count=_record("device_count", lambda: 8),
    get_device_name=_record("get_device_name", lambda i: f"Ascend910B{i}"),
    get_device_properties=_record(
        "get_device_properties", lambda i: types.SimpleNamespace(total_memory=64 << 30)),
    manual_seed_all=_record("manual_seed_all", lambda seed: None),
))
"""


def test_ascend_device_queries_import_torch_npu_then_ask_torch_npu_simulated(tmp_path):
    (tmp_path / "torch_npu.py").write_text(_SIMULATED_TORCH_NPU)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _QUERIES_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["count"] == 8 and got["name"] == "Ascend910B1" and got["memory"] == 64 << 30
    assert got["capability"] is None  # NPUs have no (major, minor); torch.npu is not asked
    assert got["host_seed"] == 5
    assert got["calls"] == [
        ["manual_seed_all", 5],
        ["device_count"],
        ["get_device_name", 1],
        ["get_device_properties", 1],
    ]
