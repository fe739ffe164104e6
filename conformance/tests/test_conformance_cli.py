"""The command line: listing cases, usage errors, and the core CLI without the suite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from opcore.testing import make_distribution


def _run(args: list[str], cwd, code: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "opcore", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_list_prints_the_selected_case_ids_without_running(tmp_path):
    proc = _run(
        [
            "conformance",
            "--platform",
            "cpu",
            "--list",
            "--ops",
            "silu_and_mul",
            "--dtypes",
            "bfloat16",
            "--checks",
            "numerics",
        ],
        tmp_path,
    )
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


def test_core_cli_names_the_suite_s_distribution_when_it_cannot_load(tmp_path):
    # The core knows `conformance` only as an entry point of opcore.cli_commands; when the
    # suite's package cannot be imported (sys.modules[name] = None makes the import fail),
    # the CLI says which distribution's command is unavailable, in one line.
    code = (
        "import sys; sys.modules['opcore_conformance'] = None\n"
        "from opcore.cli import main\nsys.exit(main(sys.argv[1:]))"
    )
    proc = _run(["conformance", "--ops", "rms_norm"], tmp_path, code=code)
    assert proc.returncode == 2
    warning = [line for line in proc.stderr.splitlines() if line.startswith("opcore: warning:")]
    assert len(warning) == 1 and "command 'conformance'" in warning[0]
    assert "from opcore-conformance " in warning[0] and "ModuleNotFoundError" in warning[0]


def test_a_terminated_run_keeps_the_records_of_the_cases_that_ran(tmp_path):
    # SIGTERM is what `timeout` and a cancelled CI job send: the run stops between cases,
    # the JSONL already holds every finished case, and the reports say the run is incomplete.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    report_dir = tmp_path / "reports"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "opcore",
            "conformance",
            "--platform",
            "cpu",
            "--full",
            "--checks",
            "opcheck",
            "--no-progress",
            "--report-dir",
            str(report_dir),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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
    junit = (report_dir / "conformance-junit.xml").read_text()
    assert 'interrupted="SIGTERM"' in junit and 'name="incomplete"' in junit


# ---------------------------------------------------------------- stopped before any case

# A general plugin that stalls (bounded) where PLANTED_SLOW_AT says: while it is loaded
# (setup), or in its op's sample generator (collection). It says so on stderr, which is
# the test's cue to interrupt.
SLOW_PLUGIN = '''
import os
import sys
import time

import torch

from opcore.ir import SampleInput, register_op

WHERE = os.environ.get("PLANTED_SLOW_AT", "")


def _stall(phase):
    print(f"planted-slow: stalling in {phase}", file=sys.stderr, flush=True)
    time.sleep(60)  # the test interrupts this long before


def register():
    if WHERE == "setup":
        _stall("setup")

    @register_op
    def planted_slow_scale(x: torch.Tensor) -> torch.Tensor:
        """2 * x."""
        return x * 2

    @planted_slow_scale.register_sample_inputs
    def _samples(dtype, *, quick, generator):
        if WHERE == "collection":
            _stall("collection")
        yield SampleInput("t2_h8", (torch.randn(2, 8, generator=generator).to(dtype),))
'''


def _drain(stream, sink: list[str]) -> None:
    for line in stream:
        sink.append(line)


@pytest.mark.parametrize("phase", ["setup", "collection"])
def test_sigint_in_setup_or_collection_exits_130_with_one_line_and_incomplete_reports(
    phase, tmp_path
):
    site = tmp_path / "site"
    make_distribution(
        site,
        "opcore-planted-slow",
        entry_points={"opcore.general_plugins": {"planted_slow": "planted_slow:register"}},
        files={"planted_slow.py": SLOW_PLUGIN},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
        PLANTED_SLOW_AT=phase,
    )
    report_dir = tmp_path / "reports"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "opcore",
            "conformance",
            "--platform",
            "cpu",
            "--ops",
            "rms_norm",
            "--dtypes",
            "float32",
            "--checks",
            "numerics",
            "--no-progress",
            "--report-dir",
            str(report_dir),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True),
    ]
    for r in readers:
        r.start()
    cue = f"planted-slow: stalling in {phase}\n"
    deadline = time.monotonic() + 90
    while cue not in err and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert cue in err, f"the run never reached the stall: {''.join(err)[-2000:]}"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    for r in readers:
        r.join(timeout=30)
    ours = [line for line in err if line != cue]
    assert proc.returncode == 130, "".join(err)[-3000:]
    assert "Traceback" not in "".join(err) and "KeyboardInterrupt" not in "".join(err)
    assert len(ours) == 1, ours
    assert ours[0].startswith(
        f"opcore conformance: interrupted by SIGINT during {phase}, before any case ran"
    )
    assert str(report_dir) in ours[0]

    lines = [
        json.loads(line) for line in (report_dir / "conformance.jsonl").read_text().splitlines()
    ]
    head, foot = lines[0], lines[-1]
    assert len(lines) == 2 and head["type"] == "header" and foot["type"] == "footer"
    assert head["platform"] == "cpu" and head["mode"] == "quick"
    assert foot["interrupted"] == "SIGINT" and foot["stopped_in"] == phase
    assert foot["collected"] is None and foot["total"] == 0 and foot["exit_status"] == 1
    summary = (report_dir / "conformance.md").read_text()
    assert summary.startswith("# opcore conformance: cpu — INCOMPLETE")
    assert f"interrupted by SIGINT during {phase}, before any case ran" in summary
    junit = ET.parse(report_dir / "conformance-junit.xml").getroot()
    assert junit.get("interrupted") == "SIGINT"
    error = junit.find("testsuite[@name='run']/testcase[@name='incomplete']/error")
    assert error is not None and f"during {phase}" in error.get("message")
    assert "INCOMPLETE" in "".join(out)


# ---------------------------------------------------------------- unusable inputs: exit 2 first

_SMALL = [
    "conformance",
    "--platform",
    "cpu",
    "--ops",
    "rms_norm",
    "--dtypes",
    "float32",
    "--checks",
    "numerics",
    "--no-progress",
]


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_a_missing_or_invalid_expectations_file_stops_the_run_before_any_case(tmp_path):
    report_dir = tmp_path / "reports"
    line = _one_line_error(
        _run([*_SMALL, "--report-dir", str(report_dir), "--expectations", "nosuch.toml"], tmp_path)
    )
    assert line.startswith("opcore conformance: --expectations: ") and "nosuch.toml" in line
    assert not report_dir.exists()  # nothing ran, nothing written, no empty directory left

    bad = tmp_path / "bad.toml"
    bad.write_text(
        'version = 1\n[[expect]]\nmatch = "numerics[*]"\nstatus = "xfial"\nreason = "r"\n'
    )
    line = _one_line_error(
        _run([*_SMALL, "--report-dir", str(report_dir), "--expectations", str(bad)], tmp_path)
    )
    assert "bad.toml" in line and "xfial" in line
    bad.write_text("version = [\n")  # not TOML at all
    line = _one_line_error(_run([*_SMALL, "--expectations", str(bad)], tmp_path))
    assert "bad.toml" in line
    assert not (tmp_path / "opcore-reports").exists() or not any(
        (tmp_path / "opcore-reports").iterdir()
    )


def test_an_unusable_report_dir_is_a_one_line_usage_error(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    line = _one_line_error(_run([*_SMALL, "--report-dir", str(a_file)], tmp_path))
    assert line == f"opcore conformance: --report-dir {a_file} is not a directory"
    line = _one_line_error(_run([*_SMALL, "--report-dir", str(a_file / "sub")], tmp_path))
    assert line.startswith(f"opcore conformance: --report-dir {a_file / 'sub'}: cannot create it")
    assert a_file.read_text() == "not a directory"


# ---------------------------------------------------------------- never overwritten silently


def test_the_default_report_dir_keeps_every_run_and_points_latest_at_the_last(tmp_path):
    first = _run(_SMALL, tmp_path)
    second = _run(_SMALL, tmp_path)
    assert first.returncode == 0 and second.returncode == 0, second.stderr[-2000:]
    base = tmp_path / "opcore-reports"
    runs = sorted(p for p in base.iterdir() if not p.is_symlink())
    assert len(runs) == 2 and all((r / "conformance.jsonl").is_file() for r in runs)
    assert (base / "latest").resolve() == runs[1].resolve()
    assert f"jsonl: {runs[1].relative_to(tmp_path) / 'conformance.jsonl'}" in second.stdout


def test_an_explicit_report_dir_holding_reports_is_refused_unless_overwrite(tmp_path):
    # An earlier run's reports (any one of the three files counts), and a file of the user's.
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    (report_dir / "conformance-junit.xml").write_text("<testsuites/>")
    (report_dir / "notes.txt").write_text("mine")
    line = _one_line_error(
        _run([*_SMALL, "--report-dir", str(report_dir), "--dtypes", "bfloat16"], tmp_path)
    )
    assert line == (
        f"opcore conformance: --report-dir {report_dir} already holds the reports of an "
        f"earlier run (conformance-junit.xml): pass --overwrite to replace them, or choose "
        f"another directory (without --report-dir each run writes its own directory "
        f"under opcore-reports/)"
    )
    assert (report_dir / "conformance-junit.xml").read_text() == "<testsuites/>"  # untouched
    proc = _run(
        [*_SMALL, "--report-dir", str(report_dir), "--dtypes", "bfloat16", "--overwrite"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(x) for x in (report_dir / "conformance.jsonl").read_text().splitlines()]
    assert {r["dtype"] for r in records if r["type"] == "case"} == {"bfloat16"}
    assert "bfloat16" in (report_dir / "conformance-junit.xml").read_text()
    assert (report_dir / "notes.txt").read_text() == "mine"  # only report files are replaced
    # --overwrite alone (no --report-dir) has nothing to overwrite: a usage error
    assert "--overwrite needs --report-dir" in _one_line_error(
        _run([*_SMALL, "--overwrite"], tmp_path)
    )


# A provider that is wrong everywhere, so every numerics case has a rerun line.
ZERO_PROVIDER = """
import torch

from opcore.ir import ops


def zeros(x, weight, epsilon, variance_size=None):
    return torch.zeros_like(x)


def register():
    ops.rms_norm.register_impl("planted_zero")(zeros)
"""


def test_rerun_lines_carry_the_environment_and_a_report_dir_and_rerun_as_printed(tmp_path):
    site = tmp_path / "site"
    make_distribution(
        site,
        "opcore-planted-zero",
        entry_points={"opcore.general_plugins": {"planted_zero": "planted_zero:register"}},
        files={"planted_zero.py": ZERO_PROVIDER},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    run_env = {**env, "OPCORE_IR_OP_PRIORITY": "rms_norm=native"}  # a variable the run depends on
    report_dir = tmp_path / "reports"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "opcore",
            "conformance",
            "--platform",
            "cpu",
            "--ops",
            "rms_norm",
            "--providers",
            "planted_zero",
            "--dtypes",
            "float32",
            "--checks",
            "numerics",
            "--no-progress",
            "--report-dir",
            str(report_dir),
        ],
        env=run_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    records = [json.loads(x) for x in (report_dir / "conformance.jsonl").read_text().splitlines()]
    failed = [r for r in records if r["type"] == "case" and r["status"] == "fail"]
    assert failed
    repro = failed[0]["repro"]
    rerun_dir = report_dir.resolve() / "rerun"
    assert repro.startswith(
        "OPCORE_IR_OP_PRIORITY=rms_norm=native opcore conformance --platform cpu "
    )
    assert "OPCORE_PLATFORM" not in repro  # --platform says it
    assert repro.endswith(f"--report-dir {rerun_dir} --overwrite")
    # identical failures print one rerun per group: this line, with the group's --case glob
    head, _, tail = repro.partition(f"--case '{failed[0]['id']}'")
    printed = [
        x.strip().removeprefix("rerun: ")
        for x in proc.stdout.splitlines()
        if x.strip().startswith("rerun: ")
    ]
    assert any(p.startswith(head + "--case ") and p.endswith(tail) for p in printed), printed

    # Pasted into a shell without the run's variables, from elsewhere, over an earlier
    # rerun's reports: the same case, and the run's own reports untouched.
    before = (report_dir / "conformance.jsonl").read_text()
    rerun_dir.mkdir()
    (rerun_dir / "conformance.jsonl").write_text("an earlier rerun's\n")
    again = subprocess.run(
        ["bash", "-c", repro], env=env, cwd=site, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 1, again.stderr[-2000:]
    rerun = [json.loads(x) for x in (rerun_dir / "conformance.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rerun if r["type"] == "case"] == [failed[0]["id"]]
    assert rerun[0]["environment"]["OPCORE_IR_OP_PRIORITY"] == "rms_norm=native"
    assert (report_dir / "conformance.jsonl").read_text() == before


BROKEN_DEVICE_PLATFORM = """
from opcore_plugin_cpu.platform import CpuPlatform


class BrokenDevicePlatform(CpuPlatform):
    name = "brokendev"

    def device(self, index=0):
        # (a device type torch does not know is caught before this, naming the plugin:
        # sdk/tests/test_unknown_device_type.py)
        raise RuntimeError("the runtime lost its device")


def probe():
    return "brokendev_platform.BrokenDevicePlatform"
"""


def test_a_platform_whose_device_fails_stops_the_run_in_one_line(tmp_path):
    site = tmp_path / "site"
    make_distribution(
        site,
        "opcore-plugin-brokendev",
        entry_points={"opcore.platform_plugins": {"brokendev": "brokendev_platform:probe"}},
        files={"brokendev_platform.py": BROKEN_DEVICE_PLATFORM},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "opcore",
            "conformance",
            "--platform",
            "brokendev",
            "--ops",
            "rms_norm",
            "--report-dir",
            str(tmp_path / "r"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = _one_line_error(proc)
    assert line.startswith(
        "opcore conformance: platform 'brokendev': device(0) failed: RuntimeError"
    )
    assert not (tmp_path / "r").exists()


def test_an_existing_draft_expectations_file_is_refused_unless_overwrite(tmp_path):
    """``--draft-expectations FILE`` used to replace FILE silently after the run."""
    draft = tmp_path / "draft.toml"
    draft.write_text("# mine\n")
    report_dir = tmp_path / "reports"
    args = [*_SMALL, "--report-dir", str(report_dir), "--draft-expectations", str(draft)]
    line = _one_line_error(_run(args, tmp_path))
    assert line == (
        f"opcore conformance: --draft-expectations {draft}: the file already exists: pass "
        f"--overwrite to replace it, or choose another file"
    )
    assert draft.read_text() == "# mine\n"  # untouched
    assert not report_dir.exists()  # refused before the run: nothing ran, nothing written
    line = _one_line_error(_run([*_SMALL, "--draft-expectations", str(tmp_path)], tmp_path))
    assert line == (
        f"opcore conformance: --draft-expectations {tmp_path}: is a directory; name the file "
        f"to write"
    )
    missing = tmp_path / "no" / "draft.toml"
    line = _one_line_error(_run([*_SMALL, "--draft-expectations", str(missing)], tmp_path))
    assert line == (
        f"opcore conformance: --draft-expectations {missing}: its folder {missing.parent} "
        f"does not exist"
    )
    assert not (tmp_path / "opcore-reports").exists()
    # --overwrite replaces it (and needs no --report-dir for that)
    proc = _run([*_SMALL, "--draft-expectations", str(draft), "--overwrite"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = draft.read_text()
    assert text.startswith("# Drafted by opcore conformance") and "# mine" not in text
    assert f"drafted 0 xfail entries in {draft}" in proc.stderr


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_collective_timeout_that_is_not_positive_and_finite_is_refused(tmp_path, value):
    """``--collective-timeout 0`` or ``nan`` used to be accepted (argparse's float)."""
    proc = _run(["conformance", "--world-size", "2", "--collective-timeout", value], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"opcore conformance: error: argument --collective-timeout: expected a positive "
        f"finite number, got {value!r}"
    )
    assert not (tmp_path / "opcore-reports").exists()
