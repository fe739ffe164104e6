"""The plugin's attention backend: registered by the platform's ``import_kernels``, chosen by
the selector, and equal to the core's reference on a few conformance cases.

Each check runs in a fresh interpreter with ``OPCORE_PLATFORM={{ cookiecutter.plugin_name }}``, as a user's process
would (``import_kernels`` runs only for the current platform): on the device, or with
``{{ cookiecutter.__standin_env }}=1`` on the stand-in; with neither, the selection test is skipped with the
probe's reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from opcore.platforms import Absent

import {{ cookiecutter.__module_name }} as plugin
from {{ cookiecutter.__module_name }}.platform import ATTENTION_BACKEND, ATTENTION_BACKEND_CLASS

NAME = "{{ cookiecutter.plugin_name }}"

SELECT = """
import json, torch
from opcore.attention import AttentionSelectorConfig, registry, select_backend
from opcore.attention.testing import conformance_cases, run_case
from opcore.platforms import get_current_platform

cfg = AttentionSelectorConfig(head_size=64, num_heads=8, num_kv_heads=2, dtype=torch.float32)
selection = select_backend(cfg)
name = selection.selected
device = get_current_platform().device(0)
results = {}
for case in list(conformance_cases(quick=True))[:3]:
    if not selection.backend_cls.validate_configuration(case.selector_config(device.type)):
        result = run_case(name, case, device)
        results[case.name] = [result.passed, result.max_abs_err]
print(json.dumps({"selected": name, "class_path": registry.backend_class_path(name),
                  "origin": registry.registered_backends()[name]["origin"], "cases": results}))
"""


def _run(code: str, platform: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OPCORE_PLATFORM=platform)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_backend_is_registered_selected_and_matches_the_reference():
    found = plugin.probe()  # what opcore would decide: the device, or the stand-in
    if isinstance(found, Absent):
        pytest.skip(f"{NAME} is not active here: {found.reason}")
    proc = _run(SELECT, NAME)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["selected"] == ATTENTION_BACKEND
    assert got["class_path"] == ATTENTION_BACKEND_CLASS and got["origin"] == "plugin"
    assert got["cases"], "no conformance case suits the backend: check its declarations"
    failed = {case: err for case, (passed, err) in got["cases"].items() if not passed}
    assert not failed, f"{ATTENTION_BACKEND} differs from the reference: {failed}"


def test_backend_name_is_unknown_where_the_platform_is_not_current():
    """Names are registered by import_kernels of the current platform only."""
    code = (
        "import json\n"
        "from opcore.attention import registry\n"
        "from opcore.attention.selector import load_registrations\n"
        "load_registrations()\n"
        "print(json.dumps(registry.known_names()))\n"
    )
    proc = _run(code, "unspecified")  # the core's own platform, always there
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ATTENTION_BACKEND not in json.loads(proc.stdout.strip().splitlines()[-1])
