"""`opcore new-plugin` works from an installed opcore wheel, not only from this checkout.

The sdk is built the way a release is (sdist, then the wheel from the sdist) from a copy of
``sdk/`` (so the checkout gets no build folders), the wheel is installed by pip into a
target directory, and ``python -m opcore new-plugin`` runs from that installation.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from opcore import templates
from opcore.testing import run_python

SDK = Path(__file__).resolve().parents[1]
TEMPLATE_IN_WHEEL = "opcore/templates/plugin/"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sdk-build")
    src = root / "sdk"
    droppings = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc")

    def ignore(folder: str, names: list[str]) -> set[str]:
        # sdk/tests is not part of the distribution; the template's own tests/ is.
        top = {"tests"} if Path(folder) == SDK else set()
        return set(droppings(folder, names)) | top

    shutil.copytree(SDK, src, ignore=ignore)
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(root / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whl,) = (root / "dist").glob("opcore-*.whl")
    return whl


def test_the_wheel_holds_the_whole_template(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = {n for n in zf.namelist() if n.startswith(TEMPLATE_IN_WHEEL)}
    checkout = {
        TEMPLATE_IN_WHEEL + p.relative_to(templates.plugin_template_dir()).as_posix()
        for p in templates.plugin_template_dir().rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert names == checkout
    # Hidden files, which package-data globs would miss, are there.
    assert any(n.endswith("/.ci/run") for n in names) and any(
        n.endswith("/.gitignore") for n in names
    )


def test_new_plugin_renders_from_the_installed_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    code = f"""
import sys
import opcore
print(opcore.__file__)
from opcore.cli import main
sys.exit(main(["new-plugin", "wheelie", "-o", {str(out)!r}, "--no-input", "--vendor", "Wheel Co"]))
"""
    proc = run_python(code, site=site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith(str(site)), (
        "opcore was not imported from the wheel"
    )

    from_wheel = out / "opcore-plugin-wheelie"
    from_checkout = templates.render_plugin("wheelie", tmp_path / "checkout", vendor="Wheel Co")
    files = lambda root: {  # noqa: E731
        p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()
    }
    assert files(from_wheel) == files(from_checkout)
    # pip byte-compiled the installed template; none of that reaches the project.
    assert not list(from_wheel.rglob("__pycache__"))
