"""bench/norm_variants.py on the CPU: under Triton's interpreter every variant (the one-pass
kernel with and without cache hints, Inductor's two-pass form, the fused add with the
weight multiplied in fp32 or in the input dtype) agrees with the triton provider to 1e-2
(the script exits 1 otherwise) and is timed. Timings are not checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from opcore.testing.interpreter import run_script_under_triton_interpreter

pytest.importorskip("triton")
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "norm_variants.py"


def test_quick_variants_agree_with_the_provider_and_are_timed(tmp_path):
    out = tmp_path / "rows.json"
    run_script_under_triton_interpreter(
        str(SCRIPT), "--quick", "--rounds", "1", "--tokens", "1,3", "--dtype", "float16",
        "--json", str(out),
    )  # fmt: skip
    rows = json.loads(out.read_text())
    assert [(r["op"], r["hidden"], r["tokens"]) for r in rows] == [
        (op, h, t) for op in ("rms_norm", "fused_add_rms_norm") for h in (96, 200) for t in (1, 3)
    ]
    for r in rows:
        names = (
            ("one_pass", "one_pass_hints", "two_pass_64w2")
            if r["op"] == "rms_norm"
            else ("fp32_weight", "half_weight")
        )
        assert r["timer"] == "host" and r["dtype"] == "float16"
        assert min(r[k] for k in ("opcore", *names)) > 0


def test_the_check_names_a_variant_beyond_the_tolerance():
    from opcore.testing import scripts

    nv = scripts.load_script(SCRIPT)
    want = (torch.tensor([1.0, 2.0, 4.0]),)
    assert nv.disagreements({"one_pass": (torch.tensor([1.0, 2.0, 4.03]),)}, want) == []
    assert nv.disagreements({"half_weight": (torch.tensor([1.0, 2.2, 4.0]),)}, want) == [
        "half_weight"
    ]
