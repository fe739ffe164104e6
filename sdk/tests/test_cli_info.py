"""`opcore info`: the documented JSON schema and the human rendering."""

from __future__ import annotations

import json

import pytest

from opcore.plugins import GENERAL_PLUGINS_GROUP, PLATFORM_PLUGINS_GROUP
from opcore.testing import make_distribution, run_python


def info(*args, site=None, env=None):
    code = f"from opcore.cli import main; raise SystemExit(main({['info', *args]!r}))"
    return run_python(code, site=site, env=env)


def test_json_schema_names_cpu_here():
    proc = info("--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema_version"] == 1
    assert data["platform"]["name"] == "cpu"
    assert data["platform"]["device_type"] == "cpu"
    assert data["rule"] == "6"
    assert data["torch_version"]
    cpu = next(c for c in data["candidates"] if c["name"] == "cpu")
    for key in ("name", "tier", "activated", "error", "distribution", "version", "reason"):
        assert key in cpu
    assert cpu["activated"] is True and cpu["error"] is None
    assert cpu["distribution"] == "opcore-plugin-cpu"
    assert data["devices"]["count"] == 1
    assert data["devices"]["cores"] >= 1


def test_human_output_shows_decision_and_candidates():
    proc = info()
    assert proc.returncode == 0, proc.stderr
    assert "Platform: cpu" in proc.stdout
    assert "chosen by rule 6" in proc.stdout
    assert "opcore-plugin-cpu" in proc.stdout


def test_failed_resolution_is_reported_with_candidates(tmp_path):
    for name in ("alpha", "beta"):
        make_distribution(
            tmp_path,
            f"opcore-plugin-{name}",
            entry_points={PLATFORM_PLUGINS_GROUP: {name: f"p_{name}:probe"}},
            files={
                f"p_{name}.py": (
                    f"def probe():\n    return 'p_{name}.X'\n"
                    "from opcore_plugin_cpu.platform import CpuPlatform\n"
                    f"class X(CpuPlatform):\n    name = '{name}'\n"
                )
            },
        )
    proc = info("--json", site=tmp_path)
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["platform"] is None
    assert "alpha, beta" in data["error"]
    assert {c["name"] for c in data["candidates"] if c["activated"]} == {"alpha", "beta", "cpu"}
    human = info(site=tmp_path)
    assert "NOT RESOLVED" in human.stdout and "alpha" in human.stdout


def test_malformed_option_is_one_line_error():
    proc = info("--ir-op-priority", "rms_norm=Bad-Name")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "opcore info: error: --ir-op-priority: provider 'Bad-Name' in 'rms_norm=Bad-Name' "
        "is not a valid provider name"
    ]


def test_json_shows_ops_layers_and_attention():
    proc = info("--json", env={"OPCORE_CUSTOM_OPS": "-rms_norm"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    rms = data["ops"]["ops"]["rms_norm"]
    assert rms["effective_priority"][-1] == "native"
    assert any(p["name"] == "native" and p["supported"] for p in rms["providers"])
    layer = data["layers"]["registry"]["rms_norm"]
    assert layer["bound"] == "forward_native"
    assert "disabled by '-rms_norm'" in layer["why"]
    assert (
        "default base 'all' for mode 'eager'" in data["layers"]["registry"]["silu_and_mul"]["why"]
    )
    assert data["attention"]["probe"]["selected"] == "TORCH_NATIVE"


# --------------------------------------------------------------------------- failures
# Every field docs/cli-info.md lists, present on every run, failures included.
TOP_LEVEL_FIELDS = {
    "schema_version", "opcore_version", "plugin_api_version", "python", "torch_version",
    "platform", "rule", "reason", "error", "error_kind", "candidates", "overridden",
    "unmatched_allow_list", "environment", "resolution_ms",
    "devices", "general_plugins", "config", "ops", "layers", "attention", "compile",
    "certificates", "tuning",
}  # fmt: skip


def assert_one_line_failure(proc, status, *needles):
    """Exit ``status``, no traceback, and the failure as one last stderr line."""
    assert proc.returncode == status, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr + proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("opcore info: error: "), proc.stderr
    for needle in needles:
        assert needle in last, last
    return last


def zeta_distribution(site, probe_body):
    """An out-of-tree platform plugin ``zeta`` whose probe runs ``probe_body``."""
    make_distribution(
        site,
        "opcore-plugin-zeta",
        entry_points={PLATFORM_PLUGINS_GROUP: {"zeta": "zeta_plugin:probe"}},
        files={
            "zeta_plugin.py": f"""
                import os
                from opcore.platforms import Absent
                from opcore_plugin_cpu.platform import CpuPlatform

                def probe():
                    {probe_body}

                class Zeta(CpuPlatform):
                    name = "zeta"
            """
        },
    )


def test_explicit_platform_whose_probe_says_no_keeps_the_schema(tmp_path):
    zeta_distribution(tmp_path, "return Absent('no zeta card in this machine')")
    proc = info("--json", site=tmp_path, env={"OPCORE_PLATFORM": "zeta"})
    assert_one_line_failure(proc, 1, "OPCORE_PLATFORM=zeta", "no zeta card in this machine")
    data = json.loads(proc.stdout)
    assert set(data) == TOP_LEVEL_FIELDS
    assert data["platform"] is None and data["error_kind"] == "resolution"
    assert "no zeta card" in data["error"]
    # The candidate that was probed, with its reason (was `[]`).
    [zeta] = data["candidates"]
    assert zeta["name"] == "zeta" and zeta["probed"] and not zeta["activated"]
    assert zeta["distribution"] == "opcore-plugin-zeta"
    assert zeta["reason"] == "no zeta card in this machine"
    assert data["overridden"] == [] and data["unmatched_allow_list"] == []
    assert data["environment"]["OPCORE_PLATFORM"] == "zeta"
    assert isinstance(data["resolution_ms"], float) and data["resolution_ms"] >= 0
    assert all(data[s] is None for s in ("devices", "config", "ops", "attention"))
    human = info(site=tmp_path, env={"OPCORE_PLATFORM": "zeta"})
    assert_one_line_failure(human, 1)
    assert "Platform: NOT RESOLVED" in human.stdout and "no zeta card" in human.stdout


def test_strict_plugin_failure_prints_json_with_error(tmp_path):
    # A stand-in switch read by the probe, as `opcore new-plugin` generates it.
    zeta_distribution(
        tmp_path,
        "v = os.environ.get('OPCORE_ZETA_STANDIN', '')\n"
        "                    if v not in ('', '0', '1'):\n"
        "                        raise ValueError(f'OPCORE_ZETA_STANDIN={v!r}: expected 1 or 0')\n"
        "                    return 'zeta_plugin.Zeta' if v == '1' else Absent('no card')",
    )
    env = {"OPCORE_STRICT_PLUGINS": "1", "OPCORE_ZETA_STANDIN": "maybe"}
    proc = info("--json", site=tmp_path, env=env)
    assert_one_line_failure(proc, 1, "OPCORE_ZETA_STANDIN='maybe'", "OPCORE_STRICT_PLUGINS=1")
    data = json.loads(proc.stdout)
    assert set(data) == TOP_LEVEL_FIELDS
    assert data["platform"] is None and data["error_kind"] == "plugin"
    assert "'zeta'" in data["error"] and "OPCORE_ZETA_STANDIN='maybe'" in data["error"]
    assert data["environment"]["OPCORE_STRICT_PLUGINS"] == "1"
    # Not strict: the same plugin is one failed candidate and cpu is chosen.
    proc = info("--json", site=tmp_path, env={"OPCORE_ZETA_STANDIN": "maybe"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["platform"]["name"] == "cpu" and data["error"] is None
    zeta = next(c for c in data["candidates"] if c["name"] == "zeta")
    assert "OPCORE_ZETA_STANDIN='maybe'" in zeta["error"]


BAD_ENVIRONMENTS = [
    # (variable, value, what the one line must quote); each other variable and value is
    # checked in-process by test_config.py, through the same `create_config`.
    ("OPCORE_IR_OP_PRIORITY", "rms_norm=nosuch", "'nosuch'"),
    ("OPCORE_PLUGINS", ",", "OPCORE_PLUGINS: ','"),
    ("OPCORE_STRICT_PLUGINS", "maybe", "OPCORE_STRICT_PLUGINS: 'maybe'"),
    ("OPCORE_CUSTOM_OPS", "none,+rms_nrom", "did you mean 'rms_norm'?"),
    ("OPCORE_ATTENTION_BACKEND", "torch_natve", "did you mean 'TORCH_NATIVE'?"),
]


@pytest.mark.parametrize(("variable", "value", "quoted"), BAD_ENVIRONMENTS)
def test_bad_environment_is_one_line_and_json_keeps_its_schema(variable, value, quoted):
    proc = info("--json", env={variable: value})
    last = assert_one_line_failure(proc, 2, quoted)
    assert variable in last
    data = json.loads(proc.stdout)
    assert set(data) == TOP_LEVEL_FIELDS
    assert data["error_kind"] == "config" and quoted in data["error"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [("OPCORE_IR_OP_PRIORITY", "rms_norm=nosuch"), ("OPCORE_CUSTOM_OPS", "+rms_nrom")],
)
def test_bad_environment_in_the_table_view(variable, value):
    # rms_norm=nosuch used to end in KeyError: 'effective_priority' while rendering.
    proc = info(env={variable: value})
    assert_one_line_failure(proc, 2, variable)
    assert "Platform: cpu" in proc.stdout  # what could be found out is still shown


def test_allow_list_that_matches_nothing_lists_the_installed_plugins():
    proc = info("--json", env={"OPCORE_PLUGINS": "nosuch"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["platform"]["name"] == "unspecified"
    assert data["unmatched_allow_list"] == ["nosuch"]
    assert "OPCORE_PLUGINS=nosuch matches no installed platform plugin" in data["reason"]
    assert "installed: " in data["reason"] and "cpu" in data["reason"]
    assert "no opcore platform plugin is installed" not in proc.stderr + data["reason"]
    assert "OPCORE_PLUGINS names 'nosuch', but no installed opcore plugin has that name" in (
        proc.stderr
    )


def test_strict_general_plugin_failure_keeps_the_decision(tmp_path):
    make_distribution(
        tmp_path,
        "opcore-extras-broken",
        entry_points={GENERAL_PLUGINS_GROUP: {"broken_extras": "broken_extras:register"}},
        files={"broken_extras.py": "def register():\n    raise RuntimeError('bad registration')\n"},
    )
    proc = info("--json", site=tmp_path, env={"OPCORE_STRICT_PLUGINS": "1"})
    assert_one_line_failure(proc, 1, "'broken_extras'", "bad registration")
    data = json.loads(proc.stdout)
    assert set(data) == TOP_LEVEL_FIELDS and data["error_kind"] == "plugin"
    assert data["platform"]["name"] == "cpu"  # resolution had succeeded
    assert data["general_plugins"] is None and data["ops"] is None
