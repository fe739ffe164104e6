"""A platform that activates while torch does not know its device type (its torch
extension not installed or not imported): ``opcore info`` and ``opcore conformance`` say so
in one line naming the plugin and what to install or switch on, instead of torch's
"Expected one of cpu, cuda, ... device type" deep in a traceback; a conformance run that
cannot start exits 2.

The plugin is a real installed distribution (`make_distribution`) whose probe says
present for device type ``ghost``, which nothing registers.
"""

from __future__ import annotations

import pytest

from opcore.testing import make_distribution, run_python

PROBE = """
def probe():
    return "ghost_plugin.platform.GhostPlatform"
"""

PLATFORM = """
from opcore.platforms.torch_device import TorchDevicePlatform


class GhostPlatform(TorchDevicePlatform):
    name = "ghost"
    device_name = "ghost"
    device_type = "ghost"
    dispatch_key = "PrivateUse1"
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("ghost") / "site"
    make_distribution(
        site,
        "opcore-plugin-ghost",
        entry_points={"opcore.platform_plugins": {"ghost": "ghost_plugin:probe"}},
        files={"ghost_plugin/__init__.py": PROBE, "ghost_plugin/platform.py": PLATFORM},
    )
    return site


def _expected_line(text: str) -> str:
    lines = [line for line in text.splitlines() if "device type 'ghost'" in line]
    assert len(lines) == 1, text[-3000:]
    return lines[0]


def test_opcore_info_names_plugin_and_remedy_in_one_line(site):
    proc = run_python("", site=site, timeout=300, args=["-m", "opcore", "info"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = _expected_line(proc.stdout + proc.stderr)
    assert "platform 'ghost' (opcore-plugin-ghost" in line
    assert "torch extension" in line and "OPCORE_GHOST_STANDIN=1" in line
    assert "Expected one of cpu" not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_conformance_cannot_start_and_exits_2_in_one_line(site, tmp_path):
    proc = run_python(
        "",
        site=site,
        timeout=300,
        args=[
            "-m",
            "opcore",
            "conformance",
            "--ops",
            "rms_norm",
            "--no-progress",
            "--report-dir",
            str(tmp_path / "reports"),
        ],
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    line = _expected_line(proc.stderr)
    assert "platform 'ghost' (opcore-plugin-ghost" in line and "OPCORE_GHOST_STANDIN=1" in line
