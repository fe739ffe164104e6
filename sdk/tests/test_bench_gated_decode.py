"""bench/gated_decode.py on the CPU: under Triton's interpreter every kernel variant gives
the triton provider's bits (the script exits 1 otherwise) and each is timed in every
round; ``--sass`` compiles the variants for sm_90 with no GPU. Timings are not checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opcore.testing.interpreter import run_script_under_triton_interpreter

pytest.importorskip("triton")
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gated_decode.py"


def test_quick_variants_agree_with_the_provider_and_are_timed(tmp_path):
    out = tmp_path / "rows.json"
    run_script_under_triton_interpreter(
        str(SCRIPT), "--quick", "--rounds", "2", "--tokens", "1,3", "--json", str(out)
    )
    rows = json.loads(out.read_text())
    assert [(r["tokens"], r["d"]) for r in rows] == [(1, 80), (3, 80), (1, 96), (3, 96)]
    for r in rows:
        assert r["timer"] == "host" and r["opcore"] > 0 and r["tile_const_d"] > 0
        assert {"flat_const_d1024w4", "flat_d512w4", "flat_const_d1024w8"} <= set(r)


def test_sass_counts_each_variant_and_the_division_shows_before_the_loads(tmp_path):
    out = tmp_path / "sass.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--sass", "--tokens", "8", "--inter", "9728",
         "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["variant"]: r for r in json.loads(out.read_text())}
    assert 0 < rows["shipped"]["first_load"] < rows["shipped"]["instructions"]
    # a runtime d costs a division (row and column of each output) before the first load
    assert rows["flat_d512w4"]["first_load"] > rows["flat_const_d512w4"]["first_load"]
