"""bench/sweep_launch.py --quick on the CPU (Triton's interpreter, in a child process): one
record per op and shape (the six ops with launch spaces: norms, gated activations, and the
head kernels at a head layout), the launch model's configuration first, every
configuration run through the real launcher and checked against it, and the eager peer
timed. Timings themselves are not checked."""

from __future__ import annotations

import json
from pathlib import Path

from opcore.testing.interpreter import run_script_under_triton_interpreter

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "sweep_launch.py"


def test_sweep_launch_quick_runs_on_the_cpu(tmp_path):
    ops = ",".join(
        ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "gelu_and_mul")
        + ("rotary_embedding", "split_qkv_rmsnorm_rope")
    )
    run_script_under_triton_interpreter(
        str(SCRIPT), "--quick", "--out", str(tmp_path), "--ops", ops
    )
    head, *recs = (
        json.loads(line) for line in (tmp_path / "sweep.jsonl").read_text().split("\n") if line
    )
    assert head["device"] == "cpu" and head["torch"]
    assert {r["op"] for r in recs} == set(ops.split(","))
    assert len(recs) == 6 * 2  # two token counts each
    for r in recs:
        head_op = r["op"] in ("rotary_embedding", "split_qkv_rmsnorm_rope")
        # the head kernels' records carry the layout: `opcore bench --quick`'s 4/2 x 64
        assert (r.get("heads") == [4, 2, 64]) is head_op, r
        if head_op:
            assert set(r["default"]) == {"SPLITS", "num_warps"}
    for r in recs:
        configs = r["configs"]
        assert configs[0]["config"] == r["default"], r["op"]
        assert len({json.dumps(c["config"], sort_keys=True) for c in configs}) == len(configs)
        for c in configs:
            assert c.get("ok") is True and c["us"] > 0, (r["op"], c)
        assert r["peers"]["torch"]["us"] > 0 and r["bytes"] > 0
