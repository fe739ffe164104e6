"""The documentation site and the version facts it publishes.

`mkdocs build --strict` must pass on the real docs (a broken link, a page missing from the
tree or an API reference that does not resolve fails it), must really be strict (a planted
broken link fails it), every page of the site is linked from the README, the compatibility
matrix equals what docs/gen_compat.py generates from the packages' metadata, and every
first-party distribution declares the opcore range the version policy gives.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib
import yaml

import opcore
from opcore import version_policy

ROOT = Path(__file__).resolve().parents[2]


def _mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    # No --quiet: mkdocs counts the warnings that fail a strict build only when it logs them.
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def _nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return [p for item in nav for p in _nav_pages(item)]


def _nav() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    return _nav_pages(config["nav"])


def test_the_site_builds_strict(tmp_path):
    proc = _mkdocs_build(ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The API reference was generated from the docstrings, not left as `::: name` text.
    ir_page = (tmp_path / "site" / "reference" / "ir" / "index.html").read_text(encoding="utf-8")
    assert "doc-heading" in ir_page and ":::" not in ir_page
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text(encoding="utf-8")
    assert "Plugin API 2.0" in changelog


def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy)
    shutil.copy(ROOT / "CHANGELOG.md", copy)
    shutil.copytree(ROOT / "docs", copy / "docs")
    for src in ("sdk/src", "conformance/src"):
        shutil.copytree(ROOT / src, copy / src, ignore=shutil.ignore_patterns("__pycache__"))
    page = copy / "docs" / "ops.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [nowhere](no-such-page.md).\n")
    proc = _mkdocs_build(copy, tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stdout + proc.stderr


def test_every_docs_page_is_in_the_nav_and_the_readme():
    nav = _nav()
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert set(nav) == on_disk
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(docs/([^)#]+)", readme))
    # The site's own scaffolding (home, changelog include, API reference) is not a README link.
    expected = {p for p in nav if not p.startswith("reference/")} - {"index.md", "changelog.md"}
    assert expected <= linked, sorted(expected - linked)


def test_the_compatibility_matrix_is_generated_from_the_metadata():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_compat.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    page = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    assert f"| {opcore.__version__} | {opcore.PLUGIN_API_VERSION} |" in page


def test_every_distribution_declares_the_policy_range():
    assert (
        version_policy.major_minor(opcore.__version__)[0]
        == version_policy.major_minor(opcore.PLUGIN_API_VERSION)[0]
    )
    sdk = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text(encoding="utf-8"))
    assert sdk["project"]["version"] == opcore.__version__
    conformance = tomllib.loads((ROOT / "conformance" / "pyproject.toml").read_text("utf-8"))
    assert conformance["project"]["version"] == opcore.__version__
    folders = [ROOT / "conformance", *sorted((ROOT / "plugins").glob("*/"))]
    for folder in folders:
        project = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        opcore_reqs = [r for r in project["dependencies"] if re.match(r"opcore\b(?!-)", r)]
        assert opcore_reqs == [version_policy.requirement()], folder.name


def test_policy_requirement_and_bad_versions():
    assert version_policy.requirement("2.0.0") == "opcore>=2.0,<3"
    assert version_policy.requirement("3.4.1", name="opcore-conformance") == (
        "opcore-conformance>=3.4,<4"
    )
    try:
        version_policy.major_minor("two")
    except ValueError as exc:
        assert "'two'" in str(exc)
    else:
        raise AssertionError("a version without MAJOR.MINOR was accepted")
