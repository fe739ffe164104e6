"""``opcore conformance --case ID --dump DIR``: the dumped folder reproduces the case in a
fresh interpreter that cannot import the conformance suite.

The planted providers are the real installed distributions of conftest.py; the suite runs
through ``python -m opcore_conformance``; the dump's ``repro.py`` runs in another fresh
interpreter where importing ``opcore_conformance`` raises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FAILING = "numerics[rms_norm-planted_eps-float32-eps_1e-2_kwargs]"
PASSING = "numerics[rms_norm-planted_good-bfloat16-t5_h7]"

# Runs repro.py as __main__ with the conformance suite made unimportable.
NO_SUITE = (
    "import runpy, sys\n"
    "sys.modules['opcore_conformance'] = None  # any import of the suite raises ImportError\n"
    "script = sys.argv[1]\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(script, run_name='__main__')\n"
)


@pytest.fixture(scope="module")
def dumped(planted_site, tmp_path_factory, run_suite, read_statuses):
    base = tmp_path_factory.mktemp("dump")
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--case",
            FAILING,
            "--case",
            PASSING,
            "--dump",
            str(base / "dumps"),
            "--expectations",
            "none",
            "--no-progress",
        ],
        site=planted_site,
        report_dir=base / "reports",
    )
    return proc, read_statuses(base / "reports"), base / "dumps"


def _repro(folder: Path, *args: str, site: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_") and k != "PYTHONPATH"}
    if site is not None:  # --run needs the planted provider's distribution
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-c", NO_SUITE, str(folder / "repro.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder.parent,
    )


def test_dump_writes_one_folder_per_numerics_case(dumped):
    proc, records, dumps = dumped
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert records[FAILING]["status"] == "fail" and records[PASSING]["status"] == "pass"
    folders = sorted(p.name for p in dumps.iterdir())
    assert folders == [
        "numerics_rms_norm-planted_eps-float32-eps_1e-2_kwargs",
        "numerics_rms_norm-planted_good-bfloat16-t5_h7",
    ]
    folder = dumps / folders[0]
    for name in ("inputs.pt", "reference.pt", "output.pt", "native.pt", "case.json", "repro.py"):
        assert (folder / name).stat().st_size > 0, name
    meta = json.loads((folder / "case.json").read_text())
    assert (
        meta["case"] == FAILING and meta["status"] == "fail" and meta["provider"] == "planted_eps"
    )
    assert "dump" in proc.stderr and str(dumps) in proc.stderr


def test_the_script_reproduces_the_failure_without_the_suite(dumped):
    _, records, dumps = dumped
    rec = records[FAILING]
    got = _repro(dumps / "numerics_rms_norm-planted_eps-float32-eps_1e-2_kwargs")
    assert got.returncode == 1, got.stdout + got.stderr
    assert "ModuleNotFoundError" not in got.stderr and "ImportError" not in got.stderr
    # its own arithmetic finds what the suite found
    assert f"{rec['mismatched']}/{rec['numel']} elements over" in got.stdout, got.stdout
    assert f"worst err/tol {rec['max_ratio']:.3g}" in got.stdout, got.stdout
    assert f"peak error {rec['details']['peak_ulp']:.3g} ULP" in got.stdout, got.stdout
    assert got.stdout.rstrip().endswith("FAIL")


def test_the_script_passes_a_passing_case(dumped):
    _, records, dumps = dumped
    got = _repro(dumps / "numerics_rms_norm-planted_good-bfloat16-t5_h7")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "within the error budget" in got.stdout and got.stdout.rstrip().endswith("PASS")


def test_the_script_can_call_the_provider_again(dumped, planted_site):
    _, records, dumps = dumped
    folder = dumps / "numerics_rms_norm-planted_eps-float32-eps_1e-2_kwargs"
    (folder / "output.pt").unlink()  # --run must not need it
    got = _repro(folder, "--run", site=planted_site)
    assert got.returncode == 1, got.stdout + got.stderr
    assert f"worst err/tol {records[FAILING]['max_ratio']:.3g}" in got.stdout, got.stdout


def test_dump_without_case_is_a_usage_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "opcore_conformance", "--dump", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "opcore conformance: --dump needs --case ID (a dump is written per "
        "case; name the cases to dump)"
    )
    assert not (tmp_path / "d").exists()
