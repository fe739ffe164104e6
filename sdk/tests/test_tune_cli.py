"""`opcore tune`'s failure paths (issue 27, items 11 and 12), as real command-line runs.

A bad flag value and an ``--out`` that cannot be written are refused before anything is
measured: one line naming the flag, exit 2, nothing left behind. SIGINT or SIGTERM during
the search writes the buckets measured so far, marked incomplete, with one line and exit
128 + the signal's number (the convention ``opcore conformance`` follows: 130, 143).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from opcore.tuning import table

TUNE = "import sys; from opcore.cli import main; sys.exit(main(sys.argv[1:]))"


def _env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    env.update(
        OPCORE_PLATFORM="cpu",
        XDG_CACHE_HOME=str(tmp_path / "cache"),  # never the user's own tables
        PYTHONUNBUFFERED="1",
    )
    return env


def tune(tmp_path, *args, timeout=180):
    return subprocess.run(
        [sys.executable, "-c", TUNE, "tune", *args],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_error_line(proc, flag):
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in lines if ln.startswith("opcore tune: error:")]
    assert len(errors) == 1, proc.stderr
    assert f"argument {flag}" in errors[0], errors[0]
    return errors[0]


SMALL = ["--quick", "--ops", "rms_norm", "--tokens", "1", "--hidden", "64"]


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--budget-s", "nan"),
        ("--budget-s", "inf"),
        ("--budget-s", "-inf"),
        ("--budget-s", "0"),
        ("--rep-ms", "0"),
        ("--rep-ms", "-1"),
        ("--rep-ms", "nan"),
        ("--rep-ms", "inf"),
    ],
)
def test_a_non_positive_or_non_finite_number_is_refused_naming_the_flag(tmp_path, flag, value):
    out = tmp_path / "t.json"
    proc = tune(tmp_path, *SMALL, "--out", str(out), f"{flag}={value}")
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-1000:])
    line = _one_error_line(proc, flag)
    assert "positive finite number" in line and repr(value) in line
    assert not out.exists() and proc.stdout == ""


def test_an_unknown_op_is_one_line_with_its_prefix_once(tmp_path):
    proc = tune(tmp_path, *SMALL[:1], "--ops", "nope", "--out", str(tmp_path / "t.json"))
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc, "--ops")
    assert line.count("opcore tune") == 1, line
    assert "'nope' is not a registered op" in line and "rms_norm" in line
    assert proc.stderr.strip() == line  # the only line


def test_an_op_without_a_bucket_key_is_refused_naming_the_flag(tmp_path):
    proc = tune(tmp_path, "--ops", "scaled_fp8_quant", "--out", str(tmp_path / "t.json"))
    assert proc.returncode == 2, proc.stderr
    assert "no shape bucket key" in _one_error_line(proc, "--ops")


def test_out_naming_an_existing_directory_is_refused_before_measuring(tmp_path):
    target = tmp_path / "tables"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    proc = tune(tmp_path, *SMALL, "--out", str(target))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    line = _one_error_line(proc, "--out")
    assert "is a directory" in line and str(target / "table.json") in line
    assert proc.stdout == ""  # nothing measured
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tables"]  # no tables.tmp
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_out_under_a_file_is_refused_before_measuring(tmp_path):
    (tmp_path / "afile").write_text("x")
    proc = tune(tmp_path, *SMALL, "--out", str(tmp_path / "afile" / "t.json"))
    assert proc.returncode == 2, proc.stderr
    assert "is not a directory" in _one_error_line(proc, "--out")
    assert (tmp_path / "afile").read_text() == "x"


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    doc = {
        "format": table.FORMAT,
        "version": table.VERSION,
        "environment": dict.fromkeys(table.ENVIRONMENT_KEYS),
        "entries": [],
    }
    target = tmp_path / "t.json"
    target.mkdir()  # os.replace onto a directory fails after the temporary file is written
    with pytest.raises(OSError):
        table.dump(doc, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


# --------------------------------------------------------------------------- signals
# Real buckets on the CPU: rms_norm at hidden 4096, a few seconds each (the float64 gate
# and the host timer), so the signal lands while later buckets are still to come.
TOKENS = [64, 128, 192, 256, 320]


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_writes_the_buckets_measured_marked_incomplete(tmp_path, sig, status):
    out = tmp_path / "t.json"
    args = ["--ops", "rms_norm", "--tokens", ",".join(map(str, TOKENS)), "--hidden", "4096"]
    proc = subprocess.Popen(
        [sys.executable, "-c", TUNE, "tune", *args, "--budget-s", "300", "--out", str(out)],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    timer = threading.Timer(240, proc.kill)  # bounded: a run that never logs is killed
    timer.start()
    try:
        first = proc.stdout.readline()  # the first bucket is measured and logged
        assert first.startswith("rms_norm"), (first, proc.stderr.read() if not first else "")
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status, (proc.returncode, stderr[-3000:])
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    name = signal.Signals(sig).name
    assert lines[0].startswith(f"opcore tune: interrupted by {name}: ")
    assert "marked incomplete" in lines[0] and str(out) in lines[0]
    doc = json.loads(out.read_text())
    table.load(out)  # a valid table
    measured = [e["tokens"] for e in doc["entries"]]
    assert measured and measured == TOKENS[: len(measured)] and len(measured) < len(TOKENS)
    s = doc["search"]
    assert s["complete"] is False and s["interrupted"] == name
    assert s["not_measured"] == [f"rms_norm T={t} H=4096 bfloat16" for t in TOKENS[len(measured) :]]
    assert not (tmp_path / "t.json.tmp").exists()
    assert len(stdout.splitlines()) == len(measured) - 1  # one line per bucket, no summary


def test_a_complete_run_is_marked_complete(tmp_path):
    out = tmp_path / "t.json"
    proc = tune(tmp_path, *SMALL, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(out.read_text())["search"]
    assert s["complete"] is True and s["interrupted"] is None and s["not_measured"] == []
