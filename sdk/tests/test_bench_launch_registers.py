"""bench/launch_registers.py on the CPU: each op's Triton launcher runs on meta tensors with
its launch captured, the launch compiled for sm_90 as Triton would specialise it, and
registers and spills read from Triton's own ptxas. No GPU is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "launch_registers.py"
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build ships no ptxas")
def test_launch_registers_compiles_each_ops_launch(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OPCORE_PLATFORM"] = "cpu"
    out, jsonl = tmp_path / "regs.md", tmp_path / "launches.jsonl"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--jsonl", str(jsonl)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    launches = [json.loads(line) for line in jsonl.read_text().splitlines()]
    ops = {use[0] for e in launches for use in e["uses"]}
    assert {"rms_norm", "fused_add_rms_norm", "silu_and_mul", "gelu_and_mul",
            "rotary_embedding", "split_qkv_rmsnorm_rope", "rms_norm_static_fp8_quant",
            "silu_and_mul_fp8_quant"} <= ops  # fmt: skip
    for e in launches:
        assert 0 < e["registers"] <= 255 and 0 < e["resident_warps"] <= 64, e
    # the fp8 kernels were compiled as a GPU with fp8 conversions launches them
    quant = [e for e in launches if "ENCODE" in e["constexprs"]]
    assert quant and all(e["constexprs"]["ENCODE"] is False for e in quant)
    # 8 tokens of 3584: the norms load the weight first, and the rule's count of resident
    # programs is set against the compiled launch's
    first = [e for e in launches if e["constexprs"].get("WEIGHT_FIRST")]
    assert len(first) == 2 and all(e["rule_resident_warps"] == 51 for e in first)
    text = out.read_text()
    assert "| rms_norm | bfloat16 | 1 | 1 |" in text and "2 weight-first launches" in text
