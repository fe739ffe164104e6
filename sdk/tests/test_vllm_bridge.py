"""The vLLM bridge (integrations/vllm, ``opcore-vllm``) in the main test run.

vLLM pins its own CUDA build of torch, so its tests cannot run in this venv: this test
builds (once) a separate venv with the real vLLM, cached under
``~/.cache/opcore-vllm-venv/vllm-<version>-py<X><Y>`` (``OPCORE_VLLM_VENV_CACHE`` moves the
folder), installs this checkout's ``sdk``, ``plugins/cpu`` and ``integrations/vllm`` into it
in editable mode on every run (seconds), and runs ``integrations/vllm/tests`` there as a
subprocess with a time bound. It fails with that run's output; a skipped bridge test is a
failure too. The main venv is never touched.

Measured on the 2-core CI machine: the first run 402 s (the venv build 326 s: vLLM 0.33.0
and its CUDA dependencies, 9.4 GB on disk), a run with the venv cached 51 s
(docs/integrations.md#vllm).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_VERSION = "0.33.0"  # the version the bridge's range (>=0.33,<0.34) was tested with
BUILD_TIMEOUT_S = 1800
TEST_TIMEOUT_S = 900

pytestmark = pytest.mark.slow


def _cache_root() -> Path:
    base = os.environ.get("OPCORE_VLLM_VENV_CACHE") or "~/.cache/opcore-vllm-venv"
    return Path(base).expanduser()


def _venv() -> Path:
    v = sys.version_info
    return _cache_root() / f"vllm-{VLLM_VERSION}-py{v.major}{v.minor}"


def _clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPCORE_", "VLLM_", "PYTEST_"))
        and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    env["PATH"] = f"{_venv() / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(cmd: list[str], timeout: float, what: str) -> None:
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=_clean_env(), cwd=ROOT
    )
    if out.returncode != 0:
        tail = f"{out.stdout[-6000:]}\n{out.stderr[-6000:]}"
        pytest.fail(f"{what} failed ({out.returncode}):\n{tail}")


def _ensure_venv() -> Path:
    """The cached vLLM venv, built on first use (a lock keeps two runs from racing)."""
    venv = _venv()
    _cache_root().mkdir(parents=True, exist_ok=True)
    with open(_cache_root() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").is_file():
            shutil.rmtree(venv, ignore_errors=True)
            start = time.monotonic()
            _run([sys.executable, "-m", "venv", str(venv)], 120, "python -m venv")
            py = str(venv / "bin" / "python")
            _run(
                [py, "-m", "pip", "install", "-q", f"vllm=={VLLM_VERSION}", "pytest>=8"],
                BUILD_TIMEOUT_S,
                f"pip install vllm=={VLLM_VERSION}",
            )
            (venv / ".complete").write_text(f"built in {time.monotonic() - start:.0f} s\n")
    py = str(venv / "bin" / "python")
    # This checkout, every run: the cached venv may have been built from another one.
    _run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
        + ["-e", "sdk", "-e", "plugins/cpu", "-e", "integrations/vllm"],
        600,
        "pip install -e sdk -e plugins/cpu -e integrations/vllm",
    )
    return venv


def test_vllm_bridge_tests_pass_against_real_vllm(tmp_path):
    venv = _ensure_venv()
    junit = tmp_path / "bridge.xml"
    cmd = [str(venv / "bin" / "python"), "-m", "pytest", "integrations/vllm/tests"]
    cmd += ["-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TEST_TIMEOUT_S, env=_clean_env(), cwd=ROOT
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the bridge tests ran past {TEST_TIMEOUT_S} s:\n{exc.stdout}\n{exc.stderr}")
    text = f"{out.stdout[-12000:]}\n{out.stderr[-4000:]}"
    assert out.returncode == 0, f"the vLLM bridge tests failed:\n{text}"
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, skipped = int(suite.get("tests")), int(suite.get("skipped"))
    assert skipped == 0, f"{skipped} bridge tests skipped (they must run):\n{text}"
    assert tests >= 30, f"only {tests} bridge tests ran:\n{text}"
