"""opcore-plugin-ascend builds as a wheel that carries its entry points and data files
and does not require the vendor runtime (torch-npu is an extra)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

import pytest

PLUGIN = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ascend_wheel_builds_without_the_vendor_runtime(tmp_path):
    pytest.importorskip("build")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(tmp_path),
            str(PLUGIN),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("opcore_plugin_ascend-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = zf.read(info).decode()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "opcore_plugin_ascend/expectations.toml" in names
    assert "opcore_plugin_ascend/triton_qkv.py" in names
    assert "[opcore.platform_plugins]\nascend = opcore_plugin_ascend:probe" in entry_points
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert any(
        r.startswith("Requires-Dist: opcore<") or r.startswith("Requires-Dist: opcore>=")
        for r in requires
    )
    assert all("torch-npu" not in r or "extra ==" in r for r in requires)
    assert any("torch-npu" in r and 'extra == "npu"' in r for r in requires)
