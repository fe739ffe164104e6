"""The command line: listing cases, usage errors, and the core CLI without the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _run(args: list[str], cwd, code: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "opcore", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_list_prints_the_selected_case_ids_without_running(tmp_path):
    proc = _run(["conformance", "--platform", "cpu", "--list", "--ops", "silu_and_mul",
                 "--dtypes", "bfloat16", "--checks", "numerics"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert rows and all(r["id"].startswith("numerics[silu_and_mul-") for r in rows)
    assert all(r["dtype"] == "bfloat16" for r in rows)
    assert not (tmp_path / "opcore-reports").exists()


def test_unknown_platform_and_bad_dtype_are_usage_errors(tmp_path):
    proc = _run(["conformance", "--platform", "no_such_platform"], tmp_path)
    assert proc.returncode == 2 and "no_such_platform" in proc.stderr
    proc = _run(["conformance", "--dtypes", "float33"], tmp_path)
    assert proc.returncode == 2 and "'float33' is not a torch dtype" in proc.stderr
    proc = _run(["conformance", "--ops", "rms_nrom", "--checks", "numerics"], tmp_path)
    assert proc.returncode == 2 and "'rms_nrom' named by no case" in proc.stderr
    assert "rms_norm" in proc.stderr  # the known names are listed


def test_core_cli_explains_a_missing_suite(tmp_path):
    # sys.modules[name] = None makes the import fail exactly as if the distribution were absent
    code = ("import sys; sys.modules['opcore_conformance'] = None\n"
            "from opcore.cli import main\nsys.exit(main(sys.argv[1:]))")
    proc = _run(["conformance", "--ops", "rms_norm"], tmp_path, code=code)
    assert proc.returncode == 2
    assert "pip install opcore-conformance" in proc.stderr
