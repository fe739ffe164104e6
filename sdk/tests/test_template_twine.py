"""A rendered plugin's sdist and wheel pass ``twine check --strict`` (its README renders on
a package index, its metadata has no warning), so a vendor's first upload is not refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from opcore import templates

pytestmark = pytest.mark.slow


def test_rendered_plugin_passes_twine_check(tmp_path):
    pytest.importorskip("twine", reason="twine is in requirements.txt; CI has it")
    project = templates.render_plugin("acme", tmp_path, vendor="Acme Labs.")
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(project)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2, files
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "WARNING" not in check.stdout + check.stderr
