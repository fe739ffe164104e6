"""A plugin scaffolded for a device type torch does not know (``--device-type nimbus``)
runs on ``nimbus:0`` with its stand-in on: the stand-in is opcore's virtual device
(`opcore.vdev`) renamed to the plugin's device type. Without the device and without the
stand-in its tests skip, saying why.

The project is rendered once, pip-installed into a target directory, and its own tests and
``opcore conformance`` run in fresh interpreters, as a vendor would run them.
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

NAME = "nimbus"
STANDIN = "OPCORE_NIMBUS_STANDIN"
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


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(project dir, site dir) of ``opcore-plugin-nimbus --device-type nimbus``, installed."""
    root = tmp_path_factory.mktemp("standin")
    project = templates.render_plugin(NAME, root, device_type=NAME)
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
    return project, site


def _pytest(project: Path, site: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"],
        cwd=project,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_without_device_or_standin_its_tests_skip_saying_why(installed):
    project, site = installed
    proc = _pytest(project, site)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    # the provider, attention-selection and conformance tests: each says how to run it
    assert len(skipped) >= 3, proc.stdout[-3000:]
    assert all(STANDIN in line for line in skipped)
    assert any(
        "test_nimbus_conformance.py" in line and "no 'torch.nimbus' device module" in line
        for line in skipped
    )


def test_with_the_standin_its_tests_and_conformance_pass_on_nimbus0(installed):
    project, site = installed
    proc = _pytest(
        project,
        site,
        **{STANDIN: "1", "OPCORE_CONFORMANCE_ARGS": "--ops rms_norm --dtypes float32"},
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    for test in (
        "test_nimbus_conformance.py::test_conformance_suite_passes",
        "test_nimbus_plugin.py::test_provider_matches_the_native_reference",
        "test_nimbus_attention.py::test_backend_is_registered_selected_and_matches_the_reference",
    ):
        assert f"PASSED tests/{test}" in proc.stdout
    assert "SKIPPED" not in proc.stdout


def test_opcore_conformance_runs_on_the_renamed_virtual_device(installed, tmp_path):
    _, site = installed
    reports = tmp_path / "reports"
    proc = run_python(
        "",
        site=site,
        env={STANDIN: "1", "OPCORE_VDEV_DEVICES": "2"},
        timeout=600,
        args=[
            "-m",
            "opcore",
            "conformance",
            "--ops",
            "rms_norm",
            "--dtypes",
            "bfloat16",
            "--report-dir",
            str(reports),
            "--no-progress",
        ],
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "platform nimbus on nimbus:0" in proc.stdout
    assert "- device: `nimbus:0`" in (reports / "conformance.md").read_text()
    cases = [json.loads(line) for line in (reports / "conformance.jsonl").read_text().splitlines()]
    ours = [c for c in cases if c.get("type") == "case" and c.get("provider") == NAME]
    assert_ours_pass(ours)
    queries = next(c for c in cases if c.get("id") == "platform.device_queries")
    assert queries["status"] == "pass"


def test_chosen_by_name_without_device_or_standin_the_run_stops_in_one_line(installed):
    _, site = installed
    # OPCORE_PLATFORM names it, its probe says absent: the run cannot start (exit 2).
    proc = run_python(
        "",
        site=site,
        env={"OPCORE_PLATFORM": NAME},
        timeout=300,
        args=["-m", "opcore", "conformance", "--ops", "rms_norm", "--no-progress"],
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert NAME in proc.stderr and STANDIN in proc.stderr


def test_the_name_vdev_is_taken_by_the_virtual_device_plugin(tmp_path, capsys):
    from opcore.cli import main

    rc = main(["new-plugin", "vdev", "-o", str(tmp_path), "--no-input"])
    err = capsys.readouterr().err
    assert rc == 2 and "taken by opcore-plugin-vdev" in err
    assert list(tmp_path.iterdir()) == []
