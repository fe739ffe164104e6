"""One way to name an attention backend: the core registers only its own generic backends,
and a platform plugin registers its backends in ``import_kernels``, after which the selector,
``OPCORE_ATTENTION_BACKEND`` and ``opcore info`` all see them.

The plugin is a real installed distribution (``.dist-info`` with its entry point) and every
check runs in a fresh interpreter with a timeout, as for a user.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import opcore.attention
from opcore import PLUGIN_API_VERSION
from opcore.attention import registry
from opcore.plugins import PLATFORM_PLUGINS_GROUP
from opcore.testing import make_distribution, run_python

API_RANGE = (
    PLUGIN_API_VERSION.split(".")[0] + ".0",
    f"{int(PLUGIN_API_VERSION.split('.')[0]) + 1}.0",
)

# Backend names tied to one vendor's hardware or library. The core named several of these
# before plugin API 2.0; each belongs to the plugin that implements it.
VENDOR_NAMES = re.compile(
    r"\b(ASCEND|PALLAS|ROCM\w*|XPU\w*|NPU\w*|CUDA\w*|HIP\w*|FLASH\w*|CPU_ATTN|VDEV|CUSTOM)\b"
)
# The same names as code or docs write a backend name: quoted (``"ASCEND"``, ```PALLAS```).
QUOTED_VENDOR_NAME = re.compile(r"[\"'`]" + VENDOR_NAMES.pattern + r"[\"'`]")


def test_core_registry_holds_only_generic_backends():
    assert list(registry.CORE_BACKENDS) == ["TORCH_NATIVE", "TRITON_PAGED"]
    for name in registry.CORE_BACKENDS:
        assert not VENDOR_NAMES.search(name), name


def test_core_attention_sources_name_no_vendor_backend():
    """No vendor backend name, as code or docs quote one, in the core's attention package
    (the Triton backend's device types are lower-case torch device types, not names)."""
    root = Path(opcore.attention.__file__).parent
    found = []
    for source in sorted(root.rglob("*.py")):
        for lineno, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            if QUOTED_VENDOR_NAME.search(line):
                found.append(f"{source.relative_to(root)}:{lineno}: {line.strip()}")
    assert not found, "\n".join(found)


PLUGIN = f"""
from opcore.platforms import Platform

ATTN_PATH = "plugin_acme.attention.AcmeBackend"

def probe():
    return "plugin_acme.AcmePlatform"

class AcmePlatform(Platform):
    name = "acme"
    device_name = "acme"
    device_type = "cpu"
    plugin_api = {API_RANGE!r}

    def device_count(self):
        return 1

    def get_device_name(self, index=0):
        return "acme device"

    def get_device_total_memory(self, index=0):
        return 1 << 30

    def import_kernels(self):
        from opcore.attention import register_backend

        register_backend("ACME_ATTN", ATTN_PATH)

    def get_attn_backend_candidates(self, cfg):
        return ["ACME_ATTN", "TORCH_NATIVE"]
"""

BACKEND = """
from opcore.attention.backends.torch_native import TorchNativeBackend

class AcmeBackend(TorchNativeBackend):
    name = "ACME_ATTN"
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    path = tmp_path_factory.mktemp("site")
    make_distribution(
        path,
        "opcore-plugin-acme",
        entry_points={PLATFORM_PLUGINS_GROUP: {"acme": "plugin_acme:probe"}},
        files={"plugin_acme/__init__.py": PLUGIN, "plugin_acme/attention.py": BACKEND},
    )
    return path


def info_json(site: Path, **env: str) -> tuple[int, dict]:
    proc = run_python(
        "",
        site=site,
        env={"OPCORE_PLATFORM": "acme", **env},
        args=["-m", "opcore", "info", "--json"],
        timeout=180,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {
        "stderr": proc.stderr
    }


def test_plugin_backend_registered_in_import_kernels_is_listed_and_selected(site):
    code, data = info_json(site)
    assert code == 0, data
    attention = data["attention"]
    assert attention["registry"]["ACME_ATTN"] == {
        "class_path": "plugin_acme.attention.AcmeBackend",
        "origin": "plugin",
    }
    assert attention["registry"]["TORCH_NATIVE"]["origin"] == "core"
    probe = attention["probe"]
    assert probe["selected"] == "ACME_ATTN" and probe["source"] == "platform", probe
    assert probe["class_path"] == "plugin_acme.attention.AcmeBackend"


SELECT = """
import json, torch
from opcore.attention import AttentionSelectorConfig, registry, select_backend
from opcore.settings import get_current_config
config = get_current_config()  # checks OPCORE_ATTENTION_BACKEND before any selection
before = "ACME_ATTN" in registry.known_names()
cfg = AttentionSelectorConfig(head_size=64, num_heads=4, num_kv_heads=2, dtype=torch.float32)
sel = select_backend(cfg)
print(json.dumps({"config": config.attention.backend, "selected": sel.selected,
                  "source": sel.source, "cls": sel.backend_cls.__module__,
                  "known_at_config": before}))
"""


def test_environment_names_a_plugin_backend_registered_in_import_kernels(site):
    """``OPCORE_ATTENTION_BACKEND`` is checked when the config is built, which is before
    anything dispatched: the check loads the platform's kernels, so the plugin's name is
    known, and a typo of it is refused with the closest name."""
    proc = run_python(
        SELECT,
        site=site,
        env={"OPCORE_PLATFORM": "acme", "OPCORE_ATTENTION_BACKEND": "acme_attn"},
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {
        "config": "ACME_ATTN",
        "selected": "ACME_ATTN",
        "source": "config",
        "cls": "plugin_acme.attention",
        "known_at_config": True,
    }

    proc = run_python(
        SELECT,
        site=site,
        env={"OPCORE_PLATFORM": "acme", "OPCORE_ATTENTION_BACKEND": "acme_atn"},
        timeout=180,
    )
    assert proc.returncode != 0
    assert (
        "OPCORE_ATTENTION_BACKEND: 'acme_atn' names no known attention backend "
        "(did you mean 'ACME_ATTN'?)"
    ) in proc.stderr


def test_a_plugin_name_is_unknown_where_its_platform_is_not_current(site):
    """The plugin registers only when its platform won: on the cpu platform its name is
    unknown, and ``opcore info`` lists only the core's backends."""
    code, data = info_json(site, OPCORE_PLATFORM="cpu")
    assert code == 0, data
    assert list(data["attention"]["registry"]) == ["TORCH_NATIVE", "TRITON_PAGED"]


def test_a_platform_still_mapping_names_itself_is_reported_as_written_for_api_1():
    """``get_attn_backend_cls`` is a member plugin API 2.0 removed: a class that defines it
    is named with the replacement, never silently ignored."""
    from opcore.platforms import Platform
    from opcore.platforms.api_version import removed_members_reason

    class Mapping(Platform):
        def get_attn_backend_cls(self, selected, cfg):
            return "pkg.Backend"

    reason = removed_members_reason("pkg.Mapping", Mapping)
    assert reason is not None and "defines get_attn_backend_cls" in reason
    assert "removed in plugin API 2.0" in reason
    assert "register_backend" in reason and "import_kernels" in reason
    assert removed_members_reason("pkg.Platform", Platform) is None


FIRST_SELECTION = """
import json, torch
from opcore.attention import AttentionSelectorConfig, registry, select_backend
known_before = "ACME_ATTN" in registry.known_names()
cfg = AttentionSelectorConfig(head_size=64, num_heads=4, num_kv_heads=2, dtype=torch.float32)
print(json.dumps({"known_before": known_before, "selected": select_backend(cfg).selected}))
"""


def test_the_first_thing_a_process_does_can_be_selecting_the_plugin_backend(site):
    """No op dispatched and no name configured: the selection itself runs the platform's
    ``import_kernels`` first, so the plugin's candidate is registered when it is tried."""
    proc = run_python(FIRST_SELECTION, site=site, env={"OPCORE_PLATFORM": "acme"}, timeout=180)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"known_before": False, "selected": "ACME_ATTN"}


def test_info_text_lists_the_plugin_backend(site):
    proc = run_python(
        "", site=site, env={"OPCORE_PLATFORM": "acme"}, args=["-m", "opcore", "info"], timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    assert "registered backends: TORCH_NATIVE, TRITON_PAGED, ACME_ATTN" in proc.stdout
    assert ": ACME_ATTN (from platform)" in proc.stdout


RESOLVE = """
import json, warnings
warnings.simplefilter("ignore")
from opcore.platforms import explain
d = explain().to_dict()
print(json.dumps({"platform": d["platform"]["name"],
                  "oldattn": [c for c in d["candidates"] if c["name"] == "oldattn"]}))
"""


def test_a_platform_still_defining_get_attn_backend_cls_is_refused_at_resolution(tmp_path):
    """Its mapping would be ignored in silence (the registry is the only route), so the
    plugin is refused with the member and its replacement named."""
    source = PLUGIN.replace("AcmePlatform", "OldattnPlatform").replace('"acme"', '"oldattn"')
    source = source.replace("plugin_acme", "plugin_oldattn") + (
        "\n    def get_attn_backend_cls(self, selected, cfg):\n"
        '        return "plugin_oldattn.attention.AcmeBackend"\n'
    )
    make_distribution(
        tmp_path / "site",
        "opcore-plugin-oldattn",
        entry_points={PLATFORM_PLUGINS_GROUP: {"oldattn": "plugin_oldattn:probe"}},
        files={"plugin_oldattn/__init__.py": source, "plugin_oldattn/attention.py": BACKEND},
    )
    proc = run_python(RESOLVE, site=tmp_path / "site", timeout=180)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["platform"] != "oldattn"
    (old,) = got["oldattn"]
    assert not old["activated"]
    assert "defines get_attn_backend_cls" in old["error"] and "register_backend" in old["error"]
