"""The conformance suite on the virtual device: ``opcore conformance --platform vdev`` passes
with ``device: vdev:0`` in its report, and on the second device (``--device-index 1``:
samples moved to ``vdev:1`` with their layouts, float64 reference on the CPU).

Cost: the CLI run is quick mode restricted to the two ops the ``vdev`` provider and the
platform's defaults care most about (rms_norm, silu_and_mul: every check family, native
and vdev providers, compile in the ``eager`` mode); the whole quick suite on vdev (2292
cases: 2286 pass, 6 not applicable) is what `docs/plugins/vdev.md` records and takes minutes.
"""

from __future__ import annotations

import json

from opcore.testing import run_python

CLI = "import sys; from opcore.cli import main; sys.exit(main(sys.argv[1:]))"


def _not_applicable_here(rec: dict) -> bool:
    """The cases the virtual device cannot run, each with its reason: capture safety (no
    graphs), native's supports_args (it has none), the FP8 fusions (no fp8 storage)."""
    message = rec.get("message") or ""
    return rec["status"] == "not_applicable" and (
        (rec["check"].endswith("capture_safety") and "has no graphs" in message)
        or (rec["check"] == "supports_args" and "declares no supports_args" in message)
        or (rec["check"] == "compile.quant_fusion" and "cannot hold" in message)
    )


def test_conformance_passes_on_vdev0(tmp_path):
    args = [
        "conformance",
        "--platform",
        "vdev",
        "--quick",
        "--ops",
        "rms_norm,silu_and_mul",
        "--no-progress",
        "--report-dir",
        str(tmp_path),
    ]
    proc = run_python(CLI, env={"OPCORE_VDEV": "1"}, args=args, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    report = (tmp_path / "conformance.md").read_text()
    assert "- device: `vdev:0`" in report
    statuses: dict[str, int] = {}
    checks = set()
    vdev_cases = 0
    for line in (tmp_path / "conformance.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") != "case":
            continue
        statuses[rec["status"]] = statuses.get(rec["status"], 0) + 1
        checks.add(rec["check"])
        vdev_cases += rec.get("provider") == "vdev"
        if rec["status"] == "not_applicable":
            assert _not_applicable_here(rec), rec
    assert set(statuses) <= {"pass", "not_applicable"}, statuses
    assert statuses["pass"] > 300 and vdev_cases > 100
    assert {
        "numerics",
        "functional",
        "supports_args",
        "opcheck",
        "compile.matches_eager",
        "platform.identity",
    } <= checks


def test_conformance_on_the_second_device_vdev1(tmp_path):
    """Samples moved to vdev:1 with their layouts, every result checked there against the
    float64 CPU reference; numerics and functional checks of the ops the vdev provider
    serves, both providers."""
    args = [
        "conformance",
        "--platform",
        "vdev",
        "--device-index",
        "1",
        "--ops",
        "rms_norm,fused_add_rms_norm,silu_and_mul",
        "--checks",
        "numerics,functional",
        "--dtypes",
        "float32,bfloat16",
        "--no-progress",
        "--report-dir",
        str(tmp_path),
    ]
    proc = run_python(
        CLI, env={"OPCORE_VDEV": "1", "OPCORE_VDEV_DEVICES": "2"}, args=args, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert "- device: `vdev:1`" in (tmp_path / "conformance.md").read_text()
    cases = [json.loads(line) for line in (tmp_path / "conformance.jsonl").read_text().splitlines()]
    cases = [c for c in cases if c.get("type") == "case"]
    assert {c["status"] for c in cases} == {"pass"}
    assert {c["provider"] for c in cases} == {"native", "vdev"} and len(cases) > 100


def test_a_device_index_the_platform_lacks_stops_the_run(tmp_path):
    args = [
        "conformance",
        "--platform",
        "vdev",
        "--device-index",
        "1",
        "--no-progress",
        "--report-dir",
        str(tmp_path),
    ]
    proc = run_python(CLI, env={"OPCORE_VDEV": "1"}, args=args, timeout=300)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--device-index 1: platform 'vdev' has 1 device(s)" in proc.stderr


def test_vdev_attention_backend_passes_the_attention_cases(tmp_path):
    args = [
        "conformance",
        "--platform",
        "vdev",
        "--checks",
        "attention",
        "--providers",
        "VDEV",
        "--no-progress",
        "--report-dir",
        str(tmp_path),
    ]
    proc = run_python(CLI, env={"OPCORE_VDEV": "1"}, args=args, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    cases = [json.loads(line) for line in (tmp_path / "conformance.jsonl").read_text().splitlines()]
    cases = [c for c in cases if c.get("type") == "case"]
    assert cases and {c["provider"] for c in cases} == {"VDEV"}
    # Capture safety needs graphs, which the virtual device has not: not_applicable, saying
    # so; every other attention case passes.
    capture = [c for c in cases if c["check"] == "attention.capture_safety"]
    assert capture and all(_not_applicable_here(c) for c in capture), capture
    assert {c["status"] for c in cases if c not in capture} == {"pass"}
