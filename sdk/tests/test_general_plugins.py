"""General plugins run once per process; a broken one is recorded and the others run."""

from __future__ import annotations

import json

from opcore.plugins import GENERAL_PLUGINS_GROUP
from opcore.testing import make_distribution, run_python


def install(site, name, body):
    make_distribution(
        site,
        f"opcore-extra-{name}",
        entry_points={GENERAL_PLUGINS_GROUP: {name: f"extra_{name}:register"}},
        files={f"extra_{name}.py": f"RUNS = []\ndef register():\n    RUNS.append(1)\n{body}\n"},
    )


CODE = """
import json, warnings
warnings.simplefilter("always")
from opcore.plugins import load_general_plugins
first = load_general_plugins()
second = load_general_plugins()
import extra_good, extra_bad
print(json.dumps({
    "same": first is second,
    "runs": [len(extra_good.RUNS), len(extra_bad.RUNS)],
    "errors": {r.name: r.error for r in first},
}))
"""


def test_general_plugins_run_once_and_failures_are_isolated(tmp_path):
    install(tmp_path, "good", "")
    install(tmp_path, "bad", "    raise ValueError('bad registration')")
    proc = run_python(CODE, site=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.splitlines()[-1])
    assert data["same"] is True
    assert data["runs"] == [1, 1]
    assert data["errors"] == {"good": None, "bad": "ValueError: bad registration"}
    assert "opcore plugin 'bad'" in proc.stderr


def test_general_plugin_failure_is_fatal_when_strict(tmp_path):
    install(tmp_path, "good", "")
    install(tmp_path, "bad", "    raise ValueError('bad registration')")
    proc = run_python(CODE, site=tmp_path, env={"OPCORE_STRICT_PLUGINS": "1"})
    assert proc.returncode != 0
    assert "PluginError" in proc.stderr and "bad registration" in proc.stderr


def test_allow_list_filters_general_plugins(tmp_path):
    install(tmp_path, "good", "")
    install(tmp_path, "bad", "    raise ValueError('bad registration')")
    code = CODE.replace("import extra_good, extra_bad", "import extra_good, extra_bad")
    proc = run_python(code, site=tmp_path, env={"OPCORE_PLUGINS": "good,cpu"})
    data = json.loads(proc.stdout.splitlines()[-1])
    assert data["runs"] == [1, 0]
    assert list(data["errors"]) == ["good"]
