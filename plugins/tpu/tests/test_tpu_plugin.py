"""opcore-plugin-tpu in the dev venv (no torch_xla): packaging, probe rules, platform class.

The probe tests whose names say ``simulated`` put a stand-in ``torch_xla`` module (or a
stand-in sysfs tree) on the path: no TPU and no torch_xla exist in this venv. Everything
that needs torch_xla itself runs in the torch 2.9 + torch_xla 2.9 venv through
plugins/tpu/scripts/run_conformance_xla.sh (see plugins/tpu/reports/).
"""

from __future__ import annotations

import importlib.metadata
import importlib.metadata as md
import importlib.util
import sys

import pytest
import torch

from opcore.platforms import Absent
from opcore.platforms.api_version import removed_members
from opcore_plugin_tpu import detect as probe_mod
from opcore_plugin_tpu.platform import TpuPlatform

HAS_XLA = importlib.util.find_spec("torch_xla") is not None


def test_tpu_entry_point_is_installed_in_tree():
    eps = [ep for ep in md.entry_points(group="opcore.intree_platform_plugins") if ep.name == "tpu"]
    assert len(eps) == 1
    assert eps[0].value == "opcore_plugin_tpu:probe"
    assert eps[0].dist.metadata["Name"] == "opcore-plugin-tpu"
    # The runtime is an extra, not a dependency: the plugin installs without torch_xla.
    requires = md.requires("opcore-plugin-tpu") or []
    assert not [r for r in requires if r.startswith("torch_xla") and "extra ==" not in r]


@pytest.mark.skipif(HAS_XLA, reason="torch_xla is installed here")
def test_tpu_probe_without_torch_xla_says_not_installed(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    result = probe_mod.probe()
    assert isinstance(result, Absent) and not result
    assert "torch_xla is not installed" in result.reason


@pytest.fixture
def fake_torch_xla(tmp_path, monkeypatch):
    """A stand-in `torch_xla` package (simulated presence); its body is the parameter."""

    def make(body: str = ""):
        pkg = tmp_path / "torch_xla"
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "torch_xla", raising=False)
        importlib.invalidate_caches()

    yield make
    sys.modules.pop("torch_xla", None)


def test_tpu_probe_simulated_torch_xla_activates_only_with_explicit_pjrt_cpu(
    fake_torch_xla, monkeypatch
):
    fake_torch_xla()
    monkeypatch.setattr(probe_mod, "count_tpu_chips", lambda *a, **k: 0)
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    unset = probe_mod.probe()
    assert isinstance(unset, Absent)
    assert "PJRT_DEVICE is unset" in unset.reason and "no TPU chip" in unset.reason
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    tpu = probe_mod.probe()
    assert isinstance(tpu, Absent) and "PJRT_DEVICE=TPU is set but no TPU chip" in tpu.reason
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert probe_mod.probe() == "opcore_plugin_tpu.platform.TpuPlatform"
    monkeypatch.setenv("PJRT_DEVICE", "CUDA")
    other = probe_mod.probe()
    assert isinstance(other, Absent) and "PJRT_DEVICE=CUDA" in other.reason


def test_tpu_probe_simulated_tpu_chips_activate_without_pjrt_device(fake_torch_xla, monkeypatch):
    fake_torch_xla()
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.setattr(probe_mod, "count_tpu_chips", lambda *a, **k: 4)
    assert probe_mod.probe() == "opcore_plugin_tpu.platform.TpuPlatform"


def test_tpu_probe_simulated_torch_xla_for_another_torch_release_says_so(
    fake_torch_xla, monkeypatch
):
    fake_torch_xla()
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "1.0.0" if name == "torch_xla" else real_version(name),
    )
    assert probe_mod.torch_xla_mismatch("1.0.3") is None  # same release: loads
    expected = (
        f"torch_xla 1.0.0 is built for torch 1.0, this is torch {torch.__version__} "
        "(install the torch_xla release matching torch)"
    )
    assert probe_mod.torch_xla_mismatch() == expected
    result = probe_mod.probe()
    assert isinstance(result, Absent) and result.reason == expected


# A stand-in torch_xla distribution (simulated: no torch_xla exists in this venv) whose
# import takes SLOW_IMPORT_S, as the real one takes seconds; installed as a real
# distribution and resolved in a fresh interpreter with a probe budget below that.
SLOW_IMPORT_S = 2.0


def _stand_in_torch_xla(site, body: str) -> None:
    from opcore.testing import make_distribution

    make_distribution(
        site,
        "torch_xla",
        version=torch.__version__.split("+")[0],
        files={"torch_xla/__init__.py": body},
    )


RESOLVE = """
import json, warnings
warnings.simplefilter("always")
from opcore.platforms import explain
d = explain()
print(json.dumps({"platform": d.platform.name,
                  "tpu": [c.to_dict() for c in d.candidates if c.name == "tpu"][0]}))
"""


def test_tpu_probe_budget_does_not_pay_a_simulated_slow_torch_xla_import(tmp_path):
    import json

    from opcore.testing import run_python

    _stand_in_torch_xla(tmp_path, f"import time\ntime.sleep({SLOW_IMPORT_S})\n")
    res = run_python(
        RESOLVE,
        site=tmp_path,
        timeout=120,
        env={"PJRT_DEVICE": "CPU", "OPCORE_PROBE_TIMEOUT_S": str(SLOW_IMPORT_S / 2)},
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    # The import runs when the winner is constructed, outside the probe budget.
    assert out["platform"] == "tpu", out
    assert "probe took" not in res.stderr and "did not answer in time" not in res.stderr


def test_tpu_simulated_broken_torch_xla_refuses_the_platform_with_the_import_error(tmp_path):
    import json

    from opcore.testing import run_python

    _stand_in_torch_xla(
        tmp_path, "raise ImportError('libtpu.so: cannot open shared object file')\n"
    )
    res = run_python(RESOLVE, site=tmp_path, timeout=120, env={"PJRT_DEVICE": "CPU"})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["platform"] == "cpu", out  # the fallback, with the reason on the tpu candidate
    assert "ImportError: libtpu.so: cannot open shared object file" in (
        out["tpu"]["error"] or ""
    ), out


def test_tpu_chip_count_reads_pci_ids_from_a_simulated_sysfs(tmp_path):
    def device(name, vendor, dev):
        d = tmp_path / name
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(dev + "\n")

    device("0000:00:04.0", "0x1ae0", "0x0063")  # a TPU v5e chip
    device("0000:00:05.0", "0x1ae0", "0x0063")
    device("0000:00:06.0", "0x1ae0", "0x1234")  # a Google device that is not a TPU
    device("0000:00:07.0", "0x10de", "0x0063")  # another vendor
    assert probe_mod.count_tpu_chips(str(tmp_path)) == 2
    assert probe_mod.count_tpu_chips(str(tmp_path / "missing")) == 0


def test_tpu_platform_identity_and_hooks_without_a_tpu(fake_torch_xla):
    fake_torch_xla()  # constructing the platform imports torch_xla (simulated here)
    p = TpuPlatform()
    assert (p.name, p.device_type, p.dispatch_key) == ("tpu", "xla", "XLA")
    assert p.device_control_env_var == "TPU_VISIBLE_CHIPS"
    assert p.dist_backend == "xla"
    assert "plugin_api" in vars(type(p)) and p.plugin_api == ("2.0", "3.0")  # declared, API 2.0
    assert removed_members(type(p)) == {}  # nothing plugin API 2.0 removed
    assert p.device(1) == torch.device("xla", 1)
    # Not on a TPU (torch_xla absent or on XLA:CPU): no PALLAS candidate.
    assert p.get_attn_backend_candidates(None) == ["TORCH_NATIVE"]
    assert p.get_default_ir_op_priority(None) == {}
    assert isinstance(p.inference_mode(), torch.no_grad)


def test_tpu_pallas_backend_is_registered_by_name_and_unavailable_here(fake_torch_xla):
    from opcore.attention import UnknownBackendError, backend_class_path
    from opcore.attention.registry import load_backend_class
    from opcore.attention.selector_config import AttentionSelectorConfig
    from opcore.testing.attention import unregister_backend

    fake_torch_xla()  # constructing the platform imports torch_xla (simulated here)
    p = TpuPlatform()
    assert not hasattr(p, "get_attn_backend_cls")  # removed in plugin API 2.0: the registry maps
    with pytest.raises(UnknownBackendError):  # the core reserves no vendor name
        backend_class_path("PALLAS")
    p.import_kernels()  # what the core calls once the platform is active
    try:
        assert backend_class_path("PALLAS") == "opcore_plugin_tpu.attention.PallasBackend"
    finally:
        unregister_backend("PALLAS")
    cls = load_backend_class("opcore_plugin_tpu.attention.PallasBackend")
    cfg = AttentionSelectorConfig(
        head_size=128, num_heads=8, num_kv_heads=2, dtype=torch.bfloat16, device_type="xla"
    )
    reasons = cls.validate_configuration(cfg)
    assert any("needs a TPU" in r for r in reasons)
    cfg64 = AttentionSelectorConfig(
        head_size=64, num_heads=8, num_kv_heads=2, dtype=torch.bfloat16, device_type="xla"
    )
    assert any("lane width" in r for r in cls.validate_configuration(cfg64))
    assert cls.get_kv_cache_shape(10, 16, 2, 128) == (10, 16, 4, 128)


def test_tpu_pallas_provider_is_registered_unsupported_off_a_tpu():
    from opcore.ir import ops

    sys.modules.pop("opcore_plugin_tpu.pallas_provider", None)
    try:
        from opcore_plugin_tpu import pallas_provider

        impl = ops.rms_norm.impls["pallas"]
        assert impl.supported is False  # not a TPU (here: no torch_xla at all)
        assert pallas_provider.SUPPORTED is False
        x = torch.randn(4, 128)
        assert pallas_provider._supports_rms_norm(x, torch.ones(128), 1e-6) is False
        assert ops.rms_norm.dispatch(x, torch.ones(128), 1e-6).provider != "pallas"
    finally:
        if "pallas" in ops.rms_norm.impls:
            ops.rms_norm.unregister_impl("pallas")
        sys.modules.pop("opcore_plugin_tpu.pallas_provider", None)
