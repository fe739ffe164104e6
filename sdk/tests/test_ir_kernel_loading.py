"""Provider names are checked after the platform's kernels are loaded, so the answer never
depends on whether an op was dispatched before.

An installed out-of-tree platform plugin (a real distribution, `make_distribution`) whose
``import_ir_kernels`` registers provider ``zvfast`` on ``rms_norm``; each check runs first
thing in a fresh interpreter, before any dispatch.
"""

from __future__ import annotations

import json

import pytest

from opcore.plugins import PLATFORM_PLUGINS_GROUP
from opcore.testing import make_distribution, run_python

PLUGIN = """
from opcore.platforms import Platform

def probe():
    return "opcore_plugin_zvendor.ZvendorPlatform"

class ZvendorPlatform(Platform):
    name = "zvendor"
    device_type = "cpu"
    plugin_api = ("2.0", "3.0")
    def device_count(self): return 1
    def get_device_name(self, index=0): return "zvendor device"
    def get_device_total_memory(self, index=0): return 1 << 30
    def import_ir_kernels(self):
        import opcore_plugin_zvendor.providers  # noqa: F401  (registers zvfast)
"""

PROVIDERS = """
from opcore.ir import ops

@ops.rms_norm.register_impl("zvfast")
def rms_norm(x, weight, epsilon, variance_size=None):
    return ops.rms_norm.native(x, weight, epsilon, variance_size) + 1
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("zvendor_site")
    make_distribution(
        site,
        "opcore-plugin-zvendor",
        entry_points={PLATFORM_PLUGINS_GROUP: {"zvendor": "opcore_plugin_zvendor:probe"}},
        files={
            "opcore_plugin_zvendor/__init__.py": PLUGIN,
            "opcore_plugin_zvendor/providers.py": PROVIDERS,
        },
    )
    return site


def _last_json(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_set_priority_before_any_dispatch_knows_the_platform_provider(site):
    code = """
    import json, torch
    from opcore.ir import ops
    with ops.rms_norm.set_priority(["zvfast"]):
        priority = ops.rms_norm.effective_priority()
        x, w = torch.zeros(2, 4), torch.ones(4)
        out = ops.rms_norm(x, w, 1e-6)
    from opcore.platforms import current_platform
    data = {"platform": current_platform.name, "priority": priority, "out": out.tolist()}
    print(json.dumps(data))
    """
    data = _last_json(run_python(code, site=site, timeout=120))
    assert data == {"platform": "zvendor", "priority": ["zvfast"], "out": [[1.0] * 4] * 2}


def test_explain_and_effective_priority_before_any_dispatch(site):
    code = """
    import json
    from opcore.ir import ops
    e = ops.rms_norm.explain()
    print(json.dumps({
        "explained": sorted(p["provider"] for p in e.providers),
        "priority": ops.rms_norm.effective_priority(),
    }))
    """
    data = _last_json(run_python(code, site=site, timeout=120))
    assert "zvfast" in data["explained"]
    assert data["priority"] == ["native"]  # zvfast is registered, not preferred by default


def test_env_priority_naming_the_platform_provider_before_any_dispatch(site):
    code = """
    import json
    from opcore.ir import ops
    from opcore.settings import get_current_config
    d = ops.rms_norm.decision(get_current_config())
    print(json.dumps({"names": d.names, "effective": ops.rms_norm.effective_priority()}))
    """
    env = {"OPCORE_IR_OP_PRIORITY": "rms_norm=zvfast"}
    data = _last_json(run_python(code, site=site, env=env, timeout=120))
    assert data == {"names": ["zvfast"], "effective": ["zvfast"]}


def test_an_unknown_name_is_still_refused_after_loading(site):
    code = """
    from opcore.ir import ops
    with ops.rms_norm.set_priority(["nosuch"]):
        pass
    """
    proc = run_python(code, site=site, timeout=120)
    assert proc.returncode != 0
    assert "set_priority names unknown provider(s) 'nosuch'" in proc.stderr
    assert "registered providers: native, zvfast" in proc.stderr
