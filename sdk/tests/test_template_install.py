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


def assert_ours_pass(ours: list[dict]) -> None:
    """The template provider's cases pass, but for capture_safety, which a device without
    graphs cannot check (the stand-in has none): ``not_applicable``, saying so. Its declared
    ``deterministic`` is checked as declared (not merely "could claim")."""
    assert ours, "no case of the template's provider ran"
    capture = [r for r in ours if r["check"] == "capture_safety"]
    rest = [r for r in ours if r["check"] != "capture_safety"]
    assert capture and rest
    assert all(r["status"] == "pass" for r in rest), [
        (r["id"], r["status"], r.get("message")) for r in rest if r["status"] != "pass"
    ]
    for r in capture:
        assert r["status"] == "not_applicable", (r["id"], r["status"], r.get("message"))
        assert "has no graphs" in (r.get("message") or ""), r
    determinism = [r for r in rest if r["check"] == "determinism"]
    assert determinism and all(r["details"]["declared"] for r in determinism)


def render_and_install(root: Path, name: str, **options) -> tuple[Path, Path]:
    """Render ``opcore-plugin-<name>`` under ``root`` and pip-install it into ``root/site``."""
    project = templates.render_plugin(name, root, **options)
    site = root / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(project),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / f"opcore_plugin_{name}-0.1.0.dist-info" / "entry_points.txt").is_file()
    return project, site


def run_pytest(
    project: Path, site: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """The generated project's own tests, in its directory (its own pytest configuration)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(project dir, site dir) of the rendered, pip-installed default plugin."""
    return render_and_install(tmp_path_factory.mktemp("plugin"), NAME)


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
    code = (
        DECISION
        + """
import torch
from opcore.ir import ops
x, w = torch.randn(3, 64), torch.randn(64)
print(json.dumps({"provider": ops.rms_norm.dispatch(x, w, 1e-6).provider}))
from opcore.layers import RMSNorm
layer = RMSNorm(64)
out = layer(x)
native = ops.rms_norm.native(x, layer.weight, 1e-6)
print(json.dumps({"layer": type(layer).__name__, "method": layer.bound_method,
                  "matches_native": bool(torch.allclose(out, native))}))
"""
    )
    proc = run_python(code, site=site, env={STANDIN: "1"})
    assert proc.returncode == 0, proc.stderr
    d, dispatch, layer = (json.loads(line) for line in proc.stdout.splitlines()[-3:])
    assert d["platform"] == NAME
    assert d["rule"] == "4" and "cpu" in d["overridden"]
    assert dispatch["provider"] == NAME
    assert layer == {"layer": "AcmeRMSNorm", "method": "forward_oot", "matches_native": True}


def example_expectations(project: Path) -> str:
    """The rendered expectations file with its commented example entry switched on."""
    text = (project / "src/opcore_plugin_acme/expectations.toml").read_text(encoding="utf-8")
    example = [
        line[4:]
        for line in text.splitlines()
        if line.startswith("#   ") and not line.startswith("#   #")
    ]
    return "version = 1\n" + "\n".join(example) + "\n"


def test_opcore_conformance_passes_on_it(installed, tmp_path):
    """With the expectations file's example switched on: the suite refuses an entry that
    matches no case of the whole inventory, so this also proves the example's id form."""
    from opcore_conformance import expectations

    project, site = installed
    example = tmp_path / "example.toml"
    example.write_text(example_expectations(project), encoding="utf-8")
    (entry,) = expectations.load(example).entries
    assert entry.status == "tolerance" and "bfloat16" in entry.match
    reports = tmp_path / "reports"
    proc = run_python(
        "",
        site=site,
        env={STANDIN: "1"},
        timeout=300,
        args=[
            "-m",
            "opcore",
            "conformance",
            "--ops",
            "rms_norm",
            "--dtypes",
            "float32",
            "--expectations",
            str(example),
            "--report-dir",
            str(reports),
            "--no-progress",
        ],
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "platform acme on cpu" in proc.stdout
    records = [
        json.loads(line) for line in (reports / "conformance.jsonl").read_text().splitlines()
    ]
    cases = [r for r in records if r.get("type") == "case"]
    ours = [r for r in cases if r.get("provider") == NAME]
    assert_ours_pass(ours)
    platform_checks = [r for r in cases if r["id"].startswith("platform.")]
    assert platform_checks and all(r["status"] == "pass" for r in platform_checks)


def test_its_own_tests_pass(installed):
    project, site = installed
    proc = run_pytest(
        project,
        site,
        **{STANDIN: "1", "OPCORE_CONFORMANCE_ARGS": "--ops rms_norm --dtypes float32"},
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "PASSED tests/test_acme_conformance.py::test_conformance_suite_passes" in proc.stdout
    assert (
        "PASSED tests/test_acme_plugin.py::test_provider_matches_the_native_reference"
        in proc.stdout
    )
    assert (
        "PASSED tests/test_acme_attention.py::"
        "test_backend_is_registered_selected_and_matches_the_reference" in proc.stdout
    )
    assert " skipped" not in proc.stdout.splitlines()[-1]


def test_a_plugin_for_another_device_type_installs_and_its_tests_pass(tmp_path):
    """--device-type npu on a machine without an NPU: detection says absent (with torch's
    reason), and the provider test is skipped for want of the device; the conformance
    test needs the device and is left out here."""
    project, site = render_and_install(tmp_path, "my_accel2", device_type="npu")
    proc = run_pytest(project, site, "tests/test_my_accel2_plugin.py")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    for test in (
        "entry_point_is_installed",
        "probe_without_the_standin",
        "standin_activates_and_rejects_typos",
        "platform_class_identity_and_priority",
    ):
        assert f"PASSED tests/test_my_accel2_plugin.py::test_{test}" in proc.stdout
    assert (
        "SKIPPED [1] tests/test_my_accel2_plugin.py" in proc.stdout
        and "no npu device here" in proc.stdout
    )
