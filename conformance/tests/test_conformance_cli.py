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


def test_a_terminated_run_keeps_the_records_of_the_cases_that_ran(tmp_path):
    # SIGTERM is what `timeout` and a cancelled CI job send: the run stops between cases,
    # the JSONL already holds every finished case, and the reports say the run is incomplete.
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    report_dir = tmp_path / "reports"
    proc = subprocess.Popen(
        [sys.executable, "-m", "opcore", "conformance", "--platform", "cpu", "--full", "--checks",
         "opcheck", "--no-progress", "--report-dir", str(report_dir)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    jsonl_path = report_dir / "conformance.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if jsonl_path.exists() and jsonl_path.read_text().count('"type": "case"') >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    lines = [json.loads(line) for line in jsonl_path.read_text().splitlines()]
    cases = [r for r in lines if r["type"] == "case"]
    foot = lines[-1]
    assert lines[0]["type"] == "header" and foot["type"] == "footer"
    assert foot["interrupted"] == "SIGTERM" and foot["exit_status"] == 1
    assert foot["total"] == len(cases) >= 3 and foot["collected"] > len(cases)
    assert all(r["check"] == "opcheck" and r["status"] == "pass" for r in cases)
    summary = (report_dir / "conformance.md").read_text()
    assert summary.startswith("# opcore conformance: cpu — INCOMPLETE")
    assert f"after {len(cases)} of {foot['collected']} collected" in summary
    assert "interrupted by SIGTERM" in stderr
    assert (report_dir / "conformance-junit.xml").stat().st_size > 0
