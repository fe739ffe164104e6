"""Platform resolution rules 1-8, against real installed distributions.

Each test installs small plugin distributions (real ``.dist-info`` with ``entry_points.txt``)
into a temporary site directory and resolves in a fresh interpreter, so entry points are
found by ``importlib.metadata`` exactly as for a pip-installed plugin. The in-tree ``cpu``
plugin of this checkout is installed too, as it is for every user.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from opcore import PLUGIN_API_VERSION
from opcore.plugins import INTREE_PLATFORM_PLUGINS_GROUP, PLATFORM_PLUGINS_GROUP
from opcore.testing import make_distribution, run_python

OOT = PLATFORM_PLUGINS_GROUP
INTREE = INTREE_PLATFORM_PLUGINS_GROUP
# The plugin-API range a plugin written for this core declares, and one for the next major.
_MAJOR = int(PLUGIN_API_VERSION.split(".")[0])
API_RANGE = (f"{_MAJOR}.0", f"{_MAJOR + 1}.0")
NEXT_RANGE = (f"{_MAJOR + 1}.0", f"{_MAJOR + 2}.0")


def plugin_module(name: str, *, probe_body: str = "", plugin_api=API_RANGE, top: str = "") -> str:
    """Source of a plugin module: a counting probe and a Platform subclass."""
    body = textwrap.indent(textwrap.dedent(probe_body), "    ") if probe_body else ""
    return f'''
import os
from opcore.platforms import Platform, Absent
{top}
CALLS = []

def probe():
    CALLS.append(1)
    with open(os.environ["PROBE_LOG"], "a") as f:
        f.write("{name}\\n")
{body}
    return "plugin_{name}.{name.capitalize()}Platform"

class {name.capitalize()}Platform(Platform):
    name = "{name}"
    device_type = "cpu"
    plugin_api = {tuple(plugin_api)!r}
    def device_count(self): return 1
    def get_device_name(self, index=0): return "{name} device"
    def get_device_total_memory(self, index=0): return 1 << 30
'''


@pytest.fixture
def site(tmp_path):
    """A site directory plus a probe log; returns a helper to install plugins into it."""
    site_dir = tmp_path / "site"
    log = tmp_path / "probes.log"
    log.write_text("")

    class Site:
        path = site_dir
        probe_log = log

        def add(self, name, group, **kw):
            make_distribution(
                site_dir,
                f"opcore-plugin-{name}",
                entry_points={group: {name: f"plugin_{name}:probe"}},
                files={f"plugin_{name}.py": plugin_module(name, **kw)},
            )

        def run(self, code, env=None, **kw):
            full = {"PROBE_LOG": str(log), **(env or {})}
            return run_python(code, site=site_dir, env=full, **kw)

        def probes(self):
            return log.read_text().split()

    return Site()


RESOLVE = """
import json, logging, sys, warnings
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
warnings.simplefilter("always")
from opcore import platforms
d = platforms.explain()
print(json.dumps(d.to_dict()))
"""


def resolved(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def by_name(data):
    return {c["name"]: c for c in data["candidates"]}


def test_one_out_of_tree_wins_and_log_names_overridden(site):
    site.add("vendor", OOT)
    site.add("accel", INTREE)
    proc = site.run(RESOLVE)
    data = resolved(proc)
    assert data["platform"]["name"] == "vendor"
    assert data["rule"] == "4"
    assert set(data["overridden"]) == {"accel", "cpu"}
    assert "vendor overrides in-tree" in proc.stderr
    assert "accel" in proc.stderr and "cpu" in proc.stderr
    assert by_name(data)["vendor"]["tier"] == "out-of-tree"
    assert by_name(data)["vendor"]["distribution"] == "opcore-plugin-vendor"


def test_two_out_of_tree_is_an_error_naming_both(site):
    site.add("alpha", OOT)
    site.add("beta", OOT)
    proc = site.run("from opcore.platforms import current_platform")
    assert proc.returncode != 0
    assert "PlatformResolutionError" in proc.stderr
    assert "alpha, beta" in proc.stderr
    assert "OPCORE_PLATFORM=" in proc.stderr  # says how to choose


def test_two_in_tree_accelerators_is_an_error(site):
    site.add("accel", INTREE)
    site.add("other", INTREE)
    proc = site.run("from opcore.platforms import current_platform")
    assert proc.returncode != 0
    assert "2 in-tree accelerator platforms activated (accel, other)" in proc.stderr


def test_in_tree_accelerator_beats_cpu_fallback(site):
    site.add("accel", INTREE)
    data = resolved(site.run(RESOLVE))
    assert data["platform"]["name"] == "accel"
    assert data["rule"] == "5"
    assert by_name(data)["cpu"]["activated"] is True
    assert by_name(data)["cpu"]["tier"] == "in-tree fallback"


def test_cpu_fallback_when_nothing_else_activates(site):
    site.add("accel", INTREE, probe_body="return Absent('no accel card on the bus')")
    data = resolved(site.run(RESOLVE))
    assert data["platform"]["name"] == "cpu"
    assert data["rule"] == "6"
    assert by_name(data)["accel"]["reason"] == "no accel card on the bus"


def test_opcore_platform_selects_any_plugin_and_probes_only_it(site):
    site.add("vendor", OOT)
    site.add("accel", INTREE)
    data = resolved(site.run(RESOLVE, env={"OPCORE_PLATFORM": "cpu"}))
    assert data["platform"]["name"] == "cpu"
    assert data["rule"] == "1"
    assert site.probes() == []  # neither vendor nor accel was probed
    data = resolved(site.run(RESOLVE, env={"OPCORE_PLATFORM": "accel"}))
    assert data["platform"]["name"] == "accel"
    assert site.probes() == ["accel"]


def test_opcore_platform_unspecified(site):
    site.add("vendor", OOT)
    data = resolved(site.run(RESOLVE, env={"OPCORE_PLATFORM": "unspecified"}))
    assert data["platform"]["name"] == "unspecified"
    assert data["platform"]["class"] == "opcore.platforms.interface.UnspecifiedPlatform"
    assert site.probes() == []


def test_opcore_platform_errors_with_the_probe_reason(site):
    site.add("vendor", OOT, probe_body="return Absent('driver 550 not loaded')")
    proc = site.run(RESOLVE, env={"OPCORE_PLATFORM": "vendor"})
    assert proc.returncode != 0
    assert "OPCORE_PLATFORM=vendor" in proc.stderr
    assert "driver 550 not loaded" in proc.stderr


def test_opcore_platform_unknown_name_lists_installed(site):
    site.add("vendor", OOT)
    proc = site.run(RESOLVE, env={"OPCORE_PLATFORM": "nosuch"})
    assert proc.returncode != 0
    assert "no installed platform plugin is named 'nosuch'" in proc.stderr
    assert "vendor" in proc.stderr and "cpu" in proc.stderr


def test_opcore_platform_probe_raising_is_fatal_with_its_exception(site):
    site.add("vendor", OOT, probe_body="raise OSError('firmware mismatch')")
    proc = site.run(RESOLVE, env={"OPCORE_PLATFORM": "vendor"})
    assert proc.returncode != 0
    assert "OSError: firmware mismatch" in proc.stderr


def test_allow_list_filters_and_warns_on_unknown_names(site):
    site.add("vendor", OOT)
    site.add("accel", INTREE)
    proc = site.run(RESOLVE, env={"OPCORE_PLUGINS": "cpu,accel,typo_name"})
    data = resolved(proc)
    assert data["platform"]["name"] == "accel"
    assert "vendor" not in by_name(data)
    assert site.probes() == ["accel"]
    assert "OPCORE_PLUGINS names 'typo_name'" in proc.stderr
    assert data["unmatched_allow_list"] == ["typo_name"]


def test_no_plugin_at_all_is_unspecified_with_one_warning(site):
    proc = site.run(RESOLVE, env={"OPCORE_PLUGINS": "nothing_here"})
    data = resolved(proc)
    assert data["platform"]["name"] == "unspecified"
    assert data["rule"] == "6"
    assert proc.stderr.count("running on UnspecifiedPlatform") >= 1
    # The checkout's plugins are installed: the allow-list let none through, and says so.
    assert "OPCORE_PLUGINS=nothing_here matches no installed platform plugin" in data["reason"]
    assert "(installed: " in data["reason"] and "cpu" in data["reason"]


def test_raising_probe_warns_naming_the_plugin_and_others_go_on(site):
    site.add("vendor", OOT, probe_body="raise RuntimeError('probe exploded')")
    site.add("accel", INTREE)
    proc = site.run(RESOLVE)
    data = resolved(proc)
    assert data["platform"]["name"] == "accel"
    assert "opcore plugin 'vendor'" in proc.stderr and "probe exploded" in proc.stderr
    assert by_name(data)["vendor"]["error"] == "RuntimeError: probe exploded"
    assert by_name(data)["vendor"]["activated"] is False


def test_raising_probe_is_fatal_when_strict(site):
    site.add("vendor", OOT, probe_body="raise RuntimeError('probe exploded')")
    proc = site.run(RESOLVE, env={"OPCORE_STRICT_PLUGINS": "1"})
    assert proc.returncode != 0
    assert "PluginError" in proc.stderr
    assert "'vendor'" in proc.stderr and "OPCORE_STRICT_PLUGINS=1" in proc.stderr


def test_entry_point_that_fails_to_import_is_recorded_and_shown(site):
    site.add("vendor", OOT, top="import a_module_that_does_not_exist")
    site.add("accel", INTREE)
    proc = site.run(RESOLVE)
    data = resolved(proc)
    assert data["platform"]["name"] == "accel"
    err = by_name(data)["vendor"]["error"]
    assert "ModuleNotFoundError" in err and "a_module_that_does_not_exist" in err
    info = site.run("from opcore.cli import main; main(['info'])")
    assert "vendor" in info.stdout and "a_module_that_does_not_exist" in info.stdout


def test_probe_reentering_resolution_is_a_clear_error_naming_the_plugin(site):
    site.add(
        "vendor",
        OOT,
        probe_body="from opcore.platforms import current_platform",
    )
    site.add("accel", INTREE)
    proc = site.run(RESOLVE)
    data = resolved(proc)
    err = by_name(data)["vendor"]["error"]
    assert "PlatformResolutionError" in err
    assert "'vendor' accessed current_platform while it was itself being probed" in err
    assert "opcore plugin 'vendor'" in proc.stderr
    # Strict mode turns the same re-entry into a fatal error.
    proc = site.run(RESOLVE, env={"OPCORE_STRICT_PLUGINS": "1"})
    assert proc.returncode != 0 and "re" in proc.stderr and "'vendor'" in proc.stderr


def test_plugin_import_reentering_resolution_is_a_clear_error(site):
    site.add("vendor", OOT, top="from opcore.platforms import current_platform")
    proc = site.run(RESOLVE, env={"OPCORE_PLATFORM": "vendor"})
    assert proc.returncode != 0
    assert "'vendor' accessed current_platform while it was itself being" in proc.stderr


def test_each_probe_called_exactly_once(site):
    site.add("vendor", OOT)
    site.add("accel", INTREE)
    site.add("quiet", INTREE, probe_body="return None")
    code = RESOLVE + textwrap.dedent("""
        from opcore.platforms import current_platform, get_current_platform
        assert current_platform is get_current_platform() is platforms.explain().platform
        import plugin_vendor, plugin_accel, plugin_quiet
        calls = [plugin_vendor.CALLS, plugin_accel.CALLS, plugin_quiet.CALLS]
        print(json.dumps([len(c) for c in calls]))
    """)
    proc = site.run(code)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [1, 1, 1]
    assert sorted(site.probes()) == ["accel", "quiet", "vendor"]


def test_first_access_from_eight_threads_resolves_once(site):
    site.add(
        "vendor",
        OOT,
        top="import time",
        probe_body="time.sleep(0.2)",  # widen the race window
    )
    code = """
        import threading, json
        import opcore.platforms as platforms
        barrier = threading.Barrier(8)
        seen = []
        def worker():
            barrier.wait()
            seen.append(id(platforms.get_current_platform()))
        threads = [threading.Thread(target=worker) for _ in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        import plugin_vendor
        print(json.dumps([len(set(seen)), len(seen), len(plugin_vendor.CALLS)]))
    """
    proc = site.run(code)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [1, 8, 1]


def test_first_caller_stack_is_recorded(site):
    code = """
        def my_engine_startup():
            from opcore.platforms import current_platform
        my_engine_startup()
        from opcore.platforms import explain
        print("my_engine_startup" in explain().first_caller_stack)
    """
    proc = site.run(code)
    assert proc.stdout.strip() == "True", proc.stderr


def test_incompatible_plugin_api_is_refused_naming_both_versions(site):
    site.add("vendor", OOT, plugin_api=NEXT_RANGE)
    written_for = f"plugin API >={NEXT_RANGE[0]},<{NEXT_RANGE[1]}"
    provided = f"provides plugin API {PLUGIN_API_VERSION}"
    proc = site.run(RESOLVE)
    data = resolved(proc)
    assert data["platform"]["name"] == "cpu"
    err = by_name(data)["vendor"]["error"]
    assert written_for in err and provided in err
    assert written_for in proc.stderr  # warned, not silent
    proc = site.run(RESOLVE, env={"OPCORE_PLATFORM": "vendor"})
    assert proc.returncode != 0 and provided in proc.stderr


def test_probe_returning_a_non_platform_class_is_an_error(site):
    site.add("vendor", OOT, probe_body="return 'json.JSONDecoder'")
    data = resolved(site.run(RESOLVE))
    assert "not a subclass of opcore.platforms.Platform" in by_name(data)["vendor"]["error"]
    assert data["platform"]["name"] == "cpu"
