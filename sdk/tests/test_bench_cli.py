"""`opcore bench` runs on the CPU and writes its JSON and Markdown outputs (timings are not
checked: performance is measured by benchmarks, never by tests)."""

from __future__ import annotations

import json

from opcore.bench import cases
from opcore.cli import main


def test_bench_quick_on_cpu_writes_reports(tmp_path):
    rc = main(["bench", "--quick", "--device", "cpu", "--ops", "rms_norm,split_qkv_rmsnorm_rope",
               "--tokens", "1,3", "--providers", "native,F.rms_norm", "--out", str(tmp_path)])
    assert rc == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    got = {(r["op"], r["tokens"], r["provider"]) for r in result["records"]}
    assert got == {
        ("rms_norm", 1, "native"), ("rms_norm", 3, "native"),
        ("rms_norm", 1, "F.rms_norm"), ("rms_norm", 3, "F.rms_norm"),
        ("split_qkv_rmsnorm_rope", 1, "native"), ("split_qkv_rmsnorm_rope", 3, "native"),
    }
    assert all(r["cpu_us"] > 0 for r in result["records"])
    assert result["environment"]["torch"]
    md = (tmp_path / "bench.md").read_text()
    assert "| rms_norm | H=256 | 3 | F.rms_norm |" in md


def test_case_bytes_follow_the_byte_model():
    c = cases.build("fused_add_rms_norm", 4, 256, __import__("torch").bfloat16, "cpu", quick=True)
    assert c.nbytes == (4 * 4 + 1) * 256 * 2  # read x, r; write out, residual; weight once
    s = cases.build("silu_and_mul", 2, 256, __import__("torch").float32, "cpu", quick=True)
    assert s.args[0].shape == (2, 1024) and s.nbytes == 3 * 2 * 512 * 4


def test_bench_decode_attention_on_cpu(tmp_path):
    rc = main(["bench", "--decode-attention", "--device", "cpu", "--batches", "2",
               "--contexts", "64", "--rep-ms", "1", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    result = json.loads((tmp_path / "attention.json").read_text())
    (record,) = result["records"]
    assert record["provider"] == "TORCH_NATIVE"  # the selector's choice on the cpu platform
    assert (record["batch"], record["context"]) == (2, 64)
    assert record["kv_bytes"] == 2 * 2 * 64 * 8 * 128 * 2  # K and V, bf16, once
    assert record["max_abs_err_vs_sdpa"] < 1e-2
    assert "TORCH_NATIVE B=   2 ctx=    64" in (tmp_path / "attention.md").read_text()
