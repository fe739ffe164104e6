"""The conformance suite's op samples for the ``triton`` provider, run on the CPU under
Triton's interpreter (the kernels the cuda and rocm platforms use on GPUs).

A child process: the interpreter must be on before `opcore.kernels.triton` is first
imported, and the rest of the suite shares this process. Numerics (every sample of every
op against the float64 reference) and the in-place overload, fp32 and bf16 (fp16 is
covered by sdk/tests/test_triton_kernels.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
pytest.importorskip("opcore_conformance")

CODE = (
    "import sys, opcore.kernels.triton as kt\n"
    "assert kt.INTERPRETED, 'kernels were not built under the interpreter'\n"
    "from opcore.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_conformance_samples_pass_for_triton_under_the_interpreter(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPCORE_PLATFORM": "cpu"}
    args = [
        "conformance",
        "--providers",
        "triton",
        "--checks",
        "numerics,maybe_inplace",
        "--dtypes",
        "float32,bfloat16",
        "--no-progress",
        "--report-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", CODE, *args], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    statuses: dict[tuple[str, str], int] = {}
    ops = set()
    for line in (tmp_path / "conformance.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("provider") == "triton":
            statuses[rec["status"]] = statuses.get(rec["status"], 0) + 1
            ops.add(rec.get("op"))
    assert set(statuses) == {"pass"}, statuses
    assert statuses["pass"] > 300
    assert ops >= {
        "rms_norm",
        "fused_add_rms_norm",
        "silu_and_mul",
        "gelu_and_mul",
        "rotary_embedding",
        "split_qkv_rmsnorm_rope",
    }
