"""Hostile plugins: no hang, no wrong platform, no plugin taking resolution down.

Each test installs real distributions (``.dist-info`` with ``entry_points.txt``) into a
temporary site directory and runs a fresh interpreter with a timeout, so a hang fails the
test instead of stalling the suite. The checkout's first-party plugins (``cpu`` and the
accelerators that stay inactive here) are installed too, as for every user.

To keep the suite fast, one interpreter often checks several variants: the process's own
resolution (``explain()`` / ``current_platform``) first, then further `resolve()` calls
with other ``OPCORE_*`` values (`resolve()` is the uncached rule engine behind them).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from opcore import PLUGIN_API_VERSION
from opcore.plugins import (
    GENERAL_PLUGINS_GROUP,
    INTREE_PLATFORM_PLUGINS_GROUP,
    PLATFORM_PLUGINS_GROUP,
)
from opcore.testing import make_distribution, run_python

OOT = PLATFORM_PLUGINS_GROUP
INTREE = INTREE_PLATFORM_PLUGINS_GROUP
# A hang shows as subprocess.TimeoutExpired; a healthy run takes a few seconds.
TIMEOUT = 60
# The plugin-API range a well-formed plugin of this core declares.
_MAJOR = int(PLUGIN_API_VERSION.split(".")[0])
API_RANGE = (f"{_MAJOR}.0", f"{_MAJOR + 1}.0")


def _block(code: str, indent: str) -> str:
    code = textwrap.dedent(code).strip("\n")
    return textwrap.indent(code, indent) if code else indent + "pass"


def platform_source(
    module: str,
    name: str,
    *,
    top: str = "",
    probe: str = "",
    init: str = "",
    plugin_api: object = API_RANGE,
) -> str:
    """A plugin module: ``probe`` (its body, then the class path) and its Platform class."""
    return f'''
import os, sys, time
from opcore.platforms import Platform, Absent
{textwrap.dedent(top).strip()}

def probe():
    with open(os.environ["PROBE_LOG"], "a") as f:
        f.write("{name}\\n")
{_block(probe, "    ")}
    return "{module}.ThePlatform"

class ThePlatform(Platform):
    name = "{name}"
    device_type = "cpu"
    plugin_api = {plugin_api!r}
    def __init__(self):
{_block(init, "        ")}
    def device_count(self): return 1
    def get_device_name(self, index=0): return "{name} device"
    def get_device_total_memory(self, index=0): return 1 << 30
'''


@pytest.fixture
def site(tmp_path):
    site_dir = tmp_path / "site"
    log = tmp_path / "probes.log"
    log.write_text("")

    class Site:
        def platform(self, name, group, dist=None, **kw):
            dist = dist or f"opcore-plugin-{name}"
            module = dist.replace("-", "_")
            make_distribution(
                site_dir,
                dist,
                entry_points={group: {name: f"{module}:probe"}},
                files={f"{module}.py": platform_source(module, name, **kw)},
            )

        def general(self, name, body):
            make_distribution(
                site_dir,
                f"opcore-extra-{name}",
                entry_points={GENERAL_PLUGINS_GROUP: {name: f"extra_{name}:register"}},
                files={f"extra_{name}.py": "def register():\n" + _block(body, "    ") + "\n"},
            )

        def run(self, code, env=None):
            full = {"PROBE_LOG": str(log), **(env or {})}
            return run_python(
                PRELUDE + textwrap.dedent(code), site=site_dir, env=full, timeout=TIMEOUT
            )

        def probes(self):
            return log.read_text().split()

    return Site()


PRELUDE = '''
import json, os, sys, warnings
warnings.simplefilter("always")
from opcore import platforms
from opcore.platforms import resolution

def summary(d):
    cls = type(d.platform)
    return {"platform": d.platform.name, "class": d.to_dict()["platform"]["class"],
            "object_class": f"{cls.__module__}.{cls.__qualname__}", "rule": d.rule,
            "overridden": d.overridden, "candidates": [c.to_dict() for c in d.candidates]}

def attempt(**env):
    """One more resolve() with ``env`` set on top: the decision or the error, and warnings."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = summary(resolution.resolve())
            except Exception as exc:
                out = {"raised": type(exc).__name__, "message": str(exc)}
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out["warnings"] = " | ".join(str(w.message) for w in caught)
    return out
'''

INFO_JSON = "from opcore.cli import main; code = main(['info', '--json'])\n"


def last_json(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cand(data, name, dist=None):
    dist = dist or f"opcore-plugin-{name}"
    [found] = [c for c in data["candidates"] if (c["name"], c["distribution"]) == (name, dist)]
    return found


# --------------------------------------------------------------------------- item 1
DISPATCH = """
import torch
from opcore.ir import ops
ops.rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6)
"""


def test_general_plugin_dispatching_while_loading_is_an_error_naming_it(site):
    site.general("eager", DISPATCH)
    site.general("good", "")
    proc = site.run(INFO_JSON + DISPATCH + "print('dispatched after', code)")
    assert proc.returncode == 0, proc.stderr
    data, end = json.JSONDecoder().raw_decode(proc.stdout)
    assert proc.stdout[end:].strip() == "dispatched after 0"  # the ops still work
    errors = {g["name"]: g["error"] for g in data["general_plugins"]}
    assert errors["good"] is None
    assert "'eager'" in errors["eager"] and "while it was being loaded" in errors["eager"]
    assert "opcore plugin 'eager'" in proc.stderr  # warned, not silent


SELECT = """
import torch
from opcore.attention import AttentionSelectorConfig, select_backend
cfg = AttentionSelectorConfig(head_size=64, num_heads=8, num_kv_heads=2, dtype=torch.float32,
                              block_size=16)
print(select_backend(cfg).backend_cls.__name__)
"""


def test_attention_selection_with_a_dispatching_general_plugin_does_not_hang(site):
    site.general("eager", DISPATCH)
    proc = site.run(SELECT)
    assert proc.returncode == 0, proc.stderr
    assert "opcore plugin 'eager'" in proc.stderr and "while it was being loaded" in proc.stderr
    # Strict mode: the same re-entry is fatal, and still names the plugin.
    proc = site.run(SELECT, env={"OPCORE_STRICT_PLUGINS": "1"})
    assert proc.returncode != 0
    assert "PluginError" in proc.stderr and "'eager'" in proc.stderr


# --------------------------------------------------------------------------- item 2
def test_platform_init_reading_current_platform_is_an_error_naming_the_plugin(site):
    site.platform("vendor", OOT, init="from opcore.platforms import current_platform")
    data = last_json(
        site.run("""
        explicit = attempt(OPCORE_PLATFORM="vendor")
        print(json.dumps({"explicit": explicit, "process": summary(platforms.explain())}))
    """)
    )
    process = data["process"]
    assert process["platform"] == "cpu" and process["rule"] == "6"
    vendor = cand(process, "vendor")
    assert vendor["activated"] is False
    assert "'vendor' accessed current_platform" in vendor["error"]
    explicit = data["explicit"]
    assert explicit["raised"] == "PlatformResolutionError"
    assert "'vendor' accessed current_platform" in explicit["message"]


# --------------------------------------------------------------------------- item 3
def test_probe_over_budget_fails_its_candidate_and_others_go_on(site):
    site.platform("hung", OOT, probe="time.sleep(3600)")
    site.platform("hungimport", OOT, top="time.sleep(3600)")
    site.platform("hungexplicit", OOT, probe="time.sleep(3600)")
    site.platform("slow", OOT, probe="time.sleep(1.1)")
    env = {"OPCORE_PROBE_TIMEOUT_S": "0.5", "OPCORE_PLUGINS": "cpu,hung,hungimport"}
    data = last_json(
        site.run(
            """
        print(json.dumps({
            "process": summary(platforms.explain()),
            "explicit": attempt(OPCORE_PLATFORM="hungexplicit"),
            "strict": attempt(OPCORE_PLUGINS="cpu,hung", OPCORE_STRICT_PLUGINS="1"),
            "slow": attempt(OPCORE_PLUGINS="cpu,slow", OPCORE_PROBE_TIMEOUT_S="5"),
        }))
    """,
            env=env,
        )
    )
    process = data["process"]
    assert process["platform"] == "cpu"
    for name in ("hung", "hungimport"):
        err = cand(process, name)["error"]
        assert err.startswith("TimeoutError") and "OPCORE_PROBE_TIMEOUT_S=0.5" in err, err
    assert "its probe was still running" in cand(process, "hung")["error"]
    assert "loading its entry point" in cand(process, "hungimport")["error"]
    explicit = data["explicit"]
    assert explicit["raised"] == "PlatformResolutionError"
    assert "OPCORE_PLATFORM=hungexplicit" in explicit["message"]
    assert "OPCORE_PROBE_TIMEOUT_S=0.5" in explicit["message"]
    strict = data["strict"]
    assert strict["raised"] == "PluginError" and "'hung'" in strict["message"]
    slow = data["slow"]
    assert slow["platform"] == "slow"
    assert "opcore plugin 'slow'" in slow["warnings"] and "probe took" in slow["warnings"]


def test_failed_resolution_is_cached_and_probes_run_once(site):
    site.platform("alpha", OOT)
    site.platform("beta", OOT)
    messages = last_json(
        site.run("""
        messages = []
        for access in [platforms.get_current_platform] * 3 + [platforms.explain]:
            try:
                access()
            except platforms.PlatformResolutionError as exc:
                messages.append((str(exc), [c.name for c in exc.candidates]))
        print(json.dumps(messages))
    """)
    )
    assert len(messages) == 4 and all(m == messages[0] for m in messages)
    assert "alpha, beta" in messages[0][0]
    assert sorted(site.probes()) == ["alpha", "beta"]  # once each, not once per access


def test_bad_probe_timeout_value_is_a_one_line_error_naming_it(site):
    site.platform("vendor", OOT)
    values = ["abc", "-1", "0", "nan", "inf", "1e999"]
    data = last_json(
        site.run(f"""
        print(json.dumps([attempt(OPCORE_PROBE_TIMEOUT_S=v) for v in {values!r}]))
    """)
    )
    for value, out in zip(values, data, strict=True):
        assert out.get("raised") == "PlatformResolutionError", (value, out)
        assert out["message"].startswith(f"OPCORE_PROBE_TIMEOUT_S={value!r}: ")
        assert "positive number of seconds" in out["message"] and "\n" not in out["message"]
    assert site.probes() == []  # refused before any plugin code ran
    proc = site.run(
        "from opcore.cli import main; main(['info'])", env={"OPCORE_PROBE_TIMEOUT_S": "abc"}
    )
    assert "Traceback" not in proc.stderr
    assert "OPCORE_PROBE_TIMEOUT_S='abc'" in proc.stdout + proc.stderr


# --------------------------------------------------------------------------- item 5
def test_a_plugin_name_belongs_to_one_distribution(site):
    site.platform("cpu", OOT, dist="acme-impostor")  # out-of-tree, named like the built-in
    site.platform("cpu", INTREE, dist="acme-cpu")  # in the in-tree group, same name
    site.platform("accel", INTREE, dist="acme-accel")  # third-party in the in-tree group
    data = last_json(
        site.run(
            """
        d = platforms.explain()
        assert d.platform is platforms.current_platform
        print(json.dumps({
            "process": summary(d),
            "explicit": attempt(OPCORE_PLATFORM="cpu"),
            "strict": attempt(OPCORE_STRICT_PLUGINS="1"),
            "strict_explicit": attempt(OPCORE_STRICT_PLUGINS="1", OPCORE_PLATFORM="cpu"),
            "with_accel": attempt(OPCORE_PLUGINS="cpu,accel"),
        }))
    """,
            env={"OPCORE_PLUGINS": "cpu"},
        )
    )
    process = data["process"]
    # explain() describes the object current_platform returns, and that is the built-in.
    assert process["platform"] == "cpu" and process["rule"] == "6"
    assert process["class"] == process["object_class"]
    assert process["class"].startswith("opcore_plugin_cpu.")
    assert cand(process, "cpu")["activated"] is True
    for dist in ("acme-impostor", "acme-cpu"):
        refused = cand(process, "cpu", dist)
        assert refused["activated"] is False and refused["probed"] is False
        assert dist in refused["error"] and "opcore-plugin-cpu" in refused["error"]
    assert "cpu" not in site.probes()  # no impostor's code ran (the built-in logs nothing)

    explicit = data["explicit"]
    assert explicit["rule"] == "1" and explicit["class"] == process["class"]
    assert "opcore-plugin-cpu" in cand(explicit, "cpu", "acme-impostor")["error"]
    assert "acme-impostor" in explicit["warnings"]
    for key in ("strict", "strict_explicit"):
        assert data[key]["raised"] == "PluginError", data[key]
        assert "acme-" in data[key]["message"] and "opcore-plugin-cpu" in data[key]["message"]

    # A third-party distribution in the in-tree group: the in-tree rules, its own label.
    with_accel = data["with_accel"]
    assert with_accel["platform"] == "accel" and with_accel["rule"] == "5"
    accel = cand(with_accel, "accel", "acme-accel")
    assert accel["tier"] == "third-party" and accel["first_party"] is False
    builtin = cand(with_accel, "cpu")
    assert builtin["tier"] == "in-tree fallback" and builtin["first_party"] is True
    assert with_accel["overridden"] == ["cpu"]


# --------------------------------------------------------------------------- item 10
def test_broken_plugins_are_named_and_never_take_resolution_down(site):
    low, high = API_RANGE
    for name, api in [
        ("apinone", None),
        ("apishort", (low,)),
        ("apistr", low),
        ("apibad", ("x", high)),
    ]:
        site.platform(name, OOT, plugin_api=api)
    site.platform("initraise", OOT, init="raise RuntimeError('no firmware')")
    site.platform("exitprobe", OOT, probe="sys.exit(3)")
    site.platform("exittop", OOT, top="sys.exit(5)")
    # Third-party in the in-tree group: chosen by rule 5 once initraise is out, then it fails.
    site.platform("exitinit", INTREE, dist="acme-exitinit", init="sys.exit(4)")
    site.general("quitter", "import sys; sys.exit(6)")
    data = last_json(
        site.run("""
        from opcore.plugins import load_general_plugins
        process = summary(platforms.explain())
        general = {r.name: r.error for r in load_general_plugins()}
        explicit = attempt(OPCORE_PLATFORM="initraise")
        print(json.dumps({"process": process, "general": general, "explicit": explicit}))
    """)
    )
    process = data["process"]
    assert process["platform"] == "cpu" and process["rule"] == "6"
    errors = {c["name"]: c["error"] for c in process["candidates"]}
    assert "malformed plugin_api None" in errors["apinone"]
    assert f"malformed plugin_api ({low!r},)" in errors["apishort"]
    assert f"malformed plugin_api {low!r}" in errors["apistr"]
    assert f"malformed plugin_api ('x', {high!r})" in errors["apibad"]
    assert "version 'x' is not of the form" in errors["apibad"]
    assert errors["initraise"] == "RuntimeError: no firmware"
    assert errors["exitprobe"] == "SystemExit: 3"
    assert errors["exittop"] == "SystemExit: 5"
    assert errors["exitinit"] == "SystemExit: 4"
    assert data["general"]["quitter"] == "SystemExit: 6"
    explicit = data["explicit"]
    assert explicit["raised"] == "PlatformResolutionError"
    assert (
        "OPCORE_PLATFORM=initraise" in explicit["message"] and "no firmware" in explicit["message"]
    )


def test_plugin_output_goes_to_stderr_and_info_json_stays_valid(site):
    site.platform(
        "vendor",
        OOT,
        top="print('vendor module imported')",
        probe="print('vendor probing')",
        init="print('vendor platform created')",
    )
    site.general("chatty", "print('general plugin ran')")
    proc = site.run(INFO_JSON + "print('after info')")
    assert proc.returncode == 0, proc.stderr
    data, end = json.JSONDecoder().raw_decode(proc.stdout)  # nothing before the JSON
    assert proc.stdout[end:].strip() == "after info"  # outside plugin code, stdout is stdout
    assert data["platform"]["name"] == "vendor"
    for text in (
        "vendor module imported",
        "vendor probing",
        "vendor platform created",
        "general plugin ran",
    ):
        assert text in proc.stderr
