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
    assert [(r["tokens"], r["d"]) for r in rows] == [(1, 80), (3, 80), (1, 128), (3, 128)]
    for r in rows:
        assert r["timer"] == "host" and r["opcore"] > 0 and r["tile_const_d"] > 0
        assert {"flat_const_d1024w4", "flat_d512w4", "flat_const_d1024w8"} <= set(r)
        assert r["tile_masked"] > 0
    # the unmasked launch only where the model's tile covers the output exactly: 1 x 128
    # (one 128-column tile a row); 3 rows fall short of a 4-row tile, 80 columns of 128
    assert [("tile_even" in r) for r in rows] == [False, False, True, False]


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
    # 8 x 9728 is covered exactly by 2 x 512 tiles: the shipped launch drops the masks,
    # and with them instructions before the first load
    assert rows["shipped"]["instructions"] < rows["shipped_masked"]["instructions"]
    assert rows["shipped"]["first_load"] < rows["shipped_masked"]["first_load"]
    # a runtime d costs a division (row and column of each output) before the first load
    assert rows["flat_d512w4"]["first_load"] > rows["flat_const_d512w4"]["first_load"]
