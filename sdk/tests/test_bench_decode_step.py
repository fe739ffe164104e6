"""bench/decode_step.py's checks on the CPU (``--tiny`` dimensions): the batch-invariance
check with opcore's attention passes, and ``--trace-repeat`` names a planted
non-deterministic sub-step (as it named the SDPA stand-in on the H200). Timings are not
checked (performance is measured by benchmarks, not tests)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import torch

from opcore.testing import scripts

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "decode_step.py"


def load_script():
    module = scripts.load_script(SCRIPT)
    module._tiny()
    return module


def test_batch_invariance_check_passes_with_opcore_attention(tmp_path):
    ds = load_script()
    rc = ds.main(["--tiny", "--context", "32", "--batch-invariance", "8", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "batch_invariance.json").read_text())
    assert rc == 0 and report["ok"]
    bi = report["batch_invariant"]
    assert bi["differ_alone_vs_batch"] == [] and bi["repeat_after_warmup_bitwise_equal"]
    assert "declares batch_invariant" in bi["attention"]
    assert report["standins_repeat"] == {"qkv_matmul": True, "gate_up_matmul": True,
                                         "attention": True}  # fmt: skip


def test_trace_names_a_non_deterministic_sub_step():
    ds = load_script()
    model = ds.Decoder(4, 32, torch.device("cpu"), attention="opcore")
    real = model._attention
    calls = [0]

    def flaky(self, q, p):  # row 1 gets a different last bit on every call
        calls[0] += 1
        out = real(q, p).clone()
        out[1, 0] += calls[0] * 1e-2
        return out

    model._attention = types.MethodType(flaky, model)
    with torch.inference_mode():
        traces = ds.traced_runs(model, 2)
    found = ds._compare_runs(traces[0], traces[1])
    assert found["sub_step"] == "0.attention"
    assert found["inputs_bitwise_equal"] and not found["replays_equal_each_other"]
    assert found["rows_differing_per_output"] == [1]
    # without the planted variation every sub-step repeats
    model._attention = real
    with torch.inference_mode():
        again = ds.traced_runs(model, 2)
    assert model.trace is None  # tracing is off again after the runs
    assert ds._compare_runs(again[0], again[1]) is None
