"""Run the opcore conformance suite on this plugin's platform.

The suite runs in a fresh interpreter with ``OPCORE_PLATFORM={{ cookiecutter.plugin_name }}``, on the device,
or with ``{{ cookiecutter.__standin_env }}=1`` on the stand-in
{%- if cookiecutter.__dispatch_key == "PrivateUse1" %} (opcore's virtual device renamed to '{{ cookiecutter.device_type }}'){% endif %}; with
neither, the test is skipped with the probe's reason. ``OPCORE_CONFORMANCE_ARGS`` adds options
(e.g. ``"--ops rms_norm --dtypes float32"`` for a quick look, ``"--full"`` before a release).
Reports land in ``opcore-reports/`` under pytest's temporary directory; the failure message
quotes the end of the output, repro commands included.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from opcore.platforms import Absent

import {{ cookiecutter.__module_name }} as plugin

NAME = "{{ cookiecutter.plugin_name }}"


def test_conformance_suite_passes(tmp_path):
    found = plugin.probe()  # what opcore would decide: the device, or the stand-in
    if isinstance(found, Absent):
        pytest.skip(f"{NAME} is not active here: {found.reason}")
    report_dir = tmp_path / "opcore-reports"
    extra = shlex.split(os.environ.get("OPCORE_CONFORMANCE_ARGS", ""))
    command = [
        sys.executable, "-m", "opcore", "conformance", "--platform", NAME,
        "--report-dir", str(report_dir), "--no-progress", *extra,
    ]
    env = dict(os.environ, OPCORE_PLATFORM=NAME)
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    output = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"{shlex.join(command)} exited {proc.returncode}:\n{output}"

    lines = (report_dir / "conformance.jsonl").read_text(encoding="utf-8").splitlines()
    cases = [r for r in map(json.loads, filter(None, lines)) if r.get("type") == "case"]
    ours = [r for r in cases if r.get("provider") == NAME]
    assert ours, f"the run checked no case of provider {NAME!r}; is it registered? {output}"
    assert any(r["status"] == "pass" for r in ours), f"no case of provider {NAME!r} passed: {output}"
