"""Every distribution of the repository ships a PEP 561 ``py.typed`` marker, so type
checkers use its inline annotations: the marker file exists in the package and the
distribution's setuptools package-data names it (setuptools copies only what it names).

A wheel build (slow) is not needed to check this: package-data is what setuptools reads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "sdk/src/opcore/templates/plugin/{{cookiecutter.__project_slug}}"


def _distributions() -> list[tuple[Path, Path]]:
    """(pyproject.toml, package directory) of each distribution."""
    dists = [
        (ROOT / "sdk/pyproject.toml", ROOT / "sdk/src/opcore"),
        (ROOT / "conformance/pyproject.toml", ROOT / "conformance/src/opcore_conformance"),
    ]
    for pyproject in sorted(ROOT.glob("plugins/*/pyproject.toml")):
        packages = [
            p for p in (pyproject.parent / "src").iterdir() if (p / "__init__.py").is_file()
        ]
        assert len(packages) == 1, f"{pyproject.parent}: expected one package, got {packages}"
        dists.append((pyproject, packages[0]))
    return dists


@pytest.mark.parametrize(
    "pyproject, package", _distributions(), ids=lambda v: str(v.relative_to(ROOT))
)
def test_distribution_ships_py_typed(pyproject: Path, package: Path) -> None:
    assert (package / "py.typed").is_file(), f"{package} has no py.typed"
    data = tomllib.loads(pyproject.read_text())
    package_data = data["tool"]["setuptools"]["package-data"]
    globs = package_data.get("*", []) + package_data.get(package.name, [])
    assert "py.typed" in globs, f"{pyproject}: package-data does not name py.typed"


def test_plugin_template_ships_py_typed() -> None:
    package = TEMPLATE / "src/{{cookiecutter.__module_name}}"
    assert (package / "py.typed").is_file()
    # The template's pyproject is a Jinja source; its package-data line names the module.
    text = (TEMPLATE / "pyproject.toml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("{{ cookiecutter.__module_name }} ="))
    assert '"py.typed"' in line, line
