"""`opcore info`: the documented JSON schema and the human rendering."""

from __future__ import annotations

import json

from opcore.plugins import PLATFORM_PLUGINS_GROUP
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
                f"p_{name}.py": f"def probe():\n    return 'p_{name}.X'\nfrom opcore_plugin_cpu.platform import CpuPlatform\nclass X(CpuPlatform):\n    name = '{name}'\n"
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
    assert "default base 'all' for mode 'eager'" in data["layers"]["registry"]["silu_and_mul"]["why"]
    assert data["attention"]["probe"]["selected"] == "TORCH_NATIVE"
