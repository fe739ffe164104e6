"""``opcore conformance --world-size 2`` on the CPU (gloo): spawned ranks, the collective
checks, bitwise agreement across ranks, and a killed rank that makes the others fail
instead of hanging. Each run is a fresh interpreter, as a user would start it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

# Planted providers, imported in every rank with --import: each departs from the op's
# contract in one way the suite must catch.
PLANTED = """
import torch

from opcore.distributed import get_communicator
from opcore.ir import ops


@ops.all_reduce.register_impl("planted_rank_skew")
def rank_skew(x, group):
    # DEFECT: rank 1 rounds its result one ulp up: within tolerance, not bitwise equal
    comm = get_communicator(group)
    out = comm.all_reduce(x)
    if comm.rank == 1:
        out = torch.nextafter(out, torch.full_like(out, float("inf")))
    return out


@ops.fused_all_reduce_add_rms_norm.register_impl("planted_no_reduce")
def no_reduce(x, residual, weight, epsilon, group):
    # DEFECT: forgets the all-reduce (each rank normalizes its own partial sum)
    return ops.fused_add_rms_norm(x, residual, weight, epsilon)
"""


def _conformance(
    *args: str, cwd: Path, pythonpath: str | None = None, timeout: float = 240, world: int = 2
):
    env = dict(os.environ)
    env.pop("OPCORE_PLATFORM", None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "opcore_conformance", "--world-size", str(world)]
    cmd += ["--platform", "cpu"]
    return subprocess.run(
        [*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _records(report_dir: Path) -> dict[str, dict]:
    lines = (report_dir / "collectives.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def test_world_size_2_passes_on_gloo_and_a_killed_rank_fails_the_others(tmp_path):
    start = time.monotonic()
    proc = _conformance("--report-dir", str(tmp_path / "rep"), cwd=tmp_path)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = _records(tmp_path / "rep")
    assert recs["collective.communicator"]["status"] == "pass"
    assert "gloo" in recs["collective.communicator"]["detail"]
    for op in ("all_reduce", "fused_all_reduce_add_rms_norm"):
        cases = [r for k, r in recs.items() if k.startswith(f"collective.{op}[native-")]
        # 3 dtypes x 6 samples, every one on both ranks, bitwise the same on both
        assert len(cases) == 18, sorted(recs)
        assert all(r["status"] == "pass" and r["ranks"] == ["pass", "pass"] for r in cases)
        assert all(r["bitwise_across_ranks"] is True for r in cases)
        # the in_place provider: default overload and maybe_inplace, both checked
        donated = [r for k, r in recs.items() if k.startswith(f"collective.{op}[in_place-")]
        assert len(donated) == 18 and all(r["status"] == "pass" for r in donated)
        assert all("maybe_inplace_equals_default" in r["metrics"] for r in donated)
    fused = recs["collective.fused_all_reduce_add_rms_norm[native-bfloat16-t5_h4096]"]
    assert fused["metrics"]["bitwise_equal_unfused"] is True
    assert recs["collective.primitives[float32]"]["status"] == "pass"
    # gloo's communicator does not declare capture safety: the check says so, not passes
    assert recs["collective.capture"]["status"] == "not_applicable"
    assert recs["collective.bitwise_across_ranks"]["status"] == "pass"
    killed = recs["collective.killed_rank"]
    assert killed["status"] == "pass", killed
    assert killed["ranks"] == ["ok", "died"]
    # the survivor's own error, naming the collective and the group, not a hang
    assert "rank 0 failed" in killed["detail"] and "group 'world'" in killed["detail"]
    assert took < 200
    assert (
        (tmp_path / "rep" / "collectives.md")
        .read_text()
        .startswith("# opcore conformance --world-size 2")
    )


def test_world_size_4_passes_on_gloo_and_a_killed_rank_fails_the_others(tmp_path):
    # Four ranks (issue "collectives at scale": the CPU part): every collective case passes
    # on every rank and is bitwise the same on all four, with sums of four partials (more
    # than one addition order: gloo's ring); the killed-rank phase names the survivor's
    # error on each of the three survivors.
    proc = _conformance("--report-dir", str(tmp_path / "rep"), cwd=tmp_path, world=4)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = _records(tmp_path / "rep")
    for op in ("all_reduce", "fused_all_reduce_add_rms_norm"):
        cases = [r for k, r in recs.items() if k.startswith(f"collective.{op}[native-")]
        assert len(cases) == 18, sorted(recs)
        assert all(r["status"] == "pass" and r["ranks"] == ["pass"] * 4 for r in cases)
        assert all(r["bitwise_across_ranks"] is True for r in cases)
    assert recs["collective.bitwise_across_ranks"]["status"] == "pass"
    killed = recs["collective.killed_rank"]
    assert killed["status"] == "pass", killed
    assert killed["ranks"].count("died") == 1 and killed["ranks"].count("ok") == 3, killed
    assert "group 'world'" in killed["detail"]
    assert (
        (tmp_path / "rep" / "collectives.md")
        .read_text()
        .startswith("# opcore conformance --world-size 4")
    )


def test_planted_collective_providers_fail_with_the_reason(tmp_path):
    (tmp_path / "planted_collectives.py").write_text(textwrap.dedent(PLANTED))
    proc = _conformance(
        "--checks",
        "collectives",
        "--import",
        "planted_collectives",
        "--providers",
        "planted_rank_skew,planted_no_reduce",
        "--dtypes",
        "float32",
        "--report-dir",
        str(tmp_path / "rep"),
        cwd=tmp_path,
        pythonpath=str(tmp_path),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = _records(tmp_path / "rep")
    skew = recs["collective.all_reduce[planted_rank_skew-float32-t5_h4096]"]
    # each rank alone is within tolerance of the float64 sum; only the ranks disagree
    assert skew["status"] == "fail" and skew["ranks"] == ["pass", "pass"]
    assert "differ bitwise between ranks" in skew["detail"]
    assert skew["bitwise_across_ranks"] is False
    no_reduce = recs["collective.fused_all_reduce_add_rms_norm[planted_no_reduce-float32-t1_h8]"]
    assert no_reduce["status"] == "fail" and "float64" in no_reduce["detail"]
    assert recs["collective.bitwise_across_ranks"]["status"] == "fail"
    assert "collective.killed_rank" not in recs  # --checks collectives: phase 1 only
    assert "fail  collective.all_reduce[planted_rank_skew" in proc.stdout


def test_world_size_refuses_the_single_process_options(tmp_path):
    proc = _conformance("--case", "numerics[*]", "--full", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "take no --case, --full" in proc.stderr
