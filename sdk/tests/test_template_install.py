"""A rendered plugin, really installed, is discovered, wins when opted in, and conforms.

The project is rendered once, built and installed by pip into a target directory (a real
``.dist-info`` with the entry point), and every check runs in a fresh interpreter with that
directory first on ``PYTHONPATH``, so platform resolution runs once per check as it does
for a user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opcore import templates
from opcore.testing import run_python

NAME = "acme"
STANDIN = "OPCORE_ACME_STANDIN"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(project dir, site dir) of the rendered, pip-installed default plugin."""
    root = tmp_path_factory.mktemp("plugin")
    project = templates.render_plugin(NAME, root)
    site = root / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(project)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "opcore_plugin_acme-0.1.0.dist-info" / "entry_points.txt").is_file()
    return project, site


DECISION = """
import json, warnings
warnings.simplefilter("ignore")
from opcore.platforms import explain
d = explain().to_dict()
print(json.dumps({"platform": d["platform"]["name"], "rule": d["rule"], "reason": d["reason"],
                  "overridden": d["overridden"],
                  "acme": [c for c in d["candidates"] if c["name"] == "acme"]}))
"""


def decision(site: Path, env: dict[str, str] | None = None) -> dict:
    proc = run_python(DECISION, site=site, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_installed_plugin_stays_out_unless_opted_in(installed):
    _, site = installed
    d = decision(site)
    assert d["platform"] == "cpu"
    (acme,) = d["acme"]
    assert acme["tier"] == "out-of-tree" and acme["distribution"] == "opcore-plugin-acme"
    assert acme["probed"] and not acme["activated"] and acme["error"] is None
    assert STANDIN in acme["reason"]


def test_a_typo_in_the_opt_in_is_reported_not_ignored(installed):
    _, site = installed
    d = decision(site, env={STANDIN: "true"})
    assert d["platform"] == "cpu"
    (acme,) = d["acme"]
    assert not acme["activated"] and STANDIN in acme["error"]


def test_opted_in_it_wins_over_cpu_and_its_kernels_run(installed):
    _, site = installed
    code = DECISION + """
import torch
from opcore.ir import ops
x, w = torch.randn(3, 64), torch.randn(64)
print(json.dumps({"provider": ops.rms_norm.dispatch(x, w, 1e-6).provider}))
from opcore.layers import RMSNorm
layer = RMSNorm(64)
out = layer(x)
print(json.dumps({"layer": type(layer).__name__, "method": layer.bound_method,
                  "matches_native": bool(torch.allclose(out, ops.rms_norm.native(x, layer.weight, 1e-6)))}))
"""
    proc = run_python(code, site=site, env={STANDIN: "1"})
    assert proc.returncode == 0, proc.stderr
    d, dispatch, layer = (json.loads(line) for line in proc.stdout.splitlines()[-3:])
    assert d["platform"] == NAME
    assert d["rule"] == "4" and "cpu" in d["overridden"]
    assert dispatch["provider"] == NAME
    assert layer == {"layer": "AcmeRMSNorm", "method": "forward_oot", "matches_native": True}


def test_opcore_conformance_passes_on_it(installed, tmp_path):
    _, site = installed
    reports = tmp_path / "reports"
    proc = run_python(
        "", site=site, env={STANDIN: "1"}, timeout=300,
        args=["-m", "opcore", "conformance", "--ops", "rms_norm", "--dtypes", "float32",
              "--report-dir", str(reports), "--no-progress"],
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "platform acme on cpu" in proc.stdout
    records = [json.loads(line) for line in (reports / "conformance.jsonl").read_text().splitlines()]
    cases = [r for r in records if r.get("type") == "case"]
    ours = [r for r in cases if r.get("provider") == NAME]
    assert ours and all(r["status"] == "pass" for r in ours)
    platform_checks = [r for r in cases if r["id"].startswith("platform.")]
    assert platform_checks and all(r["status"] == "pass" for r in platform_checks)


def test_its_own_tests_pass(installed):
    project, site = installed
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")
    } | {
        "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
        STANDIN: "1",
        "OPCORE_CONFORMANCE_ARGS": "--ops rms_norm --dtypes float32",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "PASSED tests/test_acme_conformance.py::test_conformance_suite_passes" in proc.stdout
    assert "PASSED tests/test_acme_plugin.py::test_provider_matches_the_native_reference" in proc.stdout
    assert " skipped" not in proc.stdout.splitlines()[-1]
