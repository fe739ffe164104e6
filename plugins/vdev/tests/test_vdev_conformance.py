"""The conformance suite on the virtual device: ``opcore conformance --platform vdev`` passes
with ``device: vdev:0`` in its report, and the suite's sample handling (layouts kept,
float64 reference on the CPU) works on a second device, ``vdev:1``.

Cost: the CLI run is quick mode restricted to the two ops the ``vdev`` provider and the
platform's defaults care most about (rms_norm, silu_and_mul: every check family, native
and vdev providers, compile in the ``eager`` mode); the whole quick suite on vdev (2269
cases, all passing) is what `docs/plugins/vdev.md` records and takes minutes.
"""

from __future__ import annotations

import json

from opcore.testing import run_python

CLI = "import sys; from opcore.cli import main; sys.exit(main(sys.argv[1:]))"


def test_conformance_passes_on_vdev0(tmp_path):
    args = ["conformance", "--platform", "vdev", "--quick", "--ops", "rms_norm,silu_and_mul",
            "--no-progress", "--report-dir", str(tmp_path)]
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
    assert set(statuses) <= {"pass", "not_applicable"}, statuses
    assert statuses["pass"] > 300 and vdev_cases > 100
    assert {"numerics", "functional", "supports_args", "opcheck", "compile.matches_eager", "platform.identity"} <= checks


MULTI = r"""
import json, torch
from opcore.ir import ops
from opcore.platforms import current_platform as p
from opcore_conformance.checks.numerics import reference
from opcore_conformance.tensors import compare, iter_tensors, to_device

dev = p.device(1)
out = {"device": str(dev), "cases": 0, "providers": [], "bad": []}
for name in ("rms_norm", "fused_add_rms_norm", "silu_and_mul"):
    op = getattr(ops, name)
    for dtype in (torch.float32, torch.bfloat16):
        atol, rtol = op.tolerance(dtype)
        for sample in op.sample_inputs("cpu", dtype, quick=True):
            args, kwargs = to_device((sample.args, dict(sample.kwargs)), dev)
            # the layout survives the move: strides and offsets as generated on the CPU
            for (_, a), (_, c) in zip(iter_tensors(args), iter_tensors(sample.args)):
                if isinstance(a, torch.Tensor) and (a.stride() != c.stride() or a.storage_offset() != c.storage_offset()):
                    out["bad"].append(f"{name}/{sample.name}: layout changed")
            provider = op.dispatch(*args, **kwargs).provider
            got = op(*args, **kwargs)
            ref, _ = reference(op, sample)
            for (path, g), (_, r) in zip(iter_tensors(got), iter_tensors(ref)):
                if g.device != dev:
                    out["bad"].append(f"{name}/{sample.name}: {path} on {g.device}")
                m = compare(g, r.to(g.dtype), atol, rtol)
                if m["mismatched"]:
                    out["bad"].append(f"{name}/{sample.name}/{dtype}: {m}")
            out["cases"] += 1
            if provider not in out["providers"]:
                out["providers"].append(provider)
print(json.dumps(out))
"""


def test_samples_on_vdev1_keep_layout_and_match_the_reference():
    proc = run_python(MULTI, env={"OPCORE_VDEV": "1", "OPCORE_VDEV_DEVICES": "2"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["device"] == "vdev:1"
    assert out["bad"] == []
    assert out["cases"] > 50 and "vdev" in out["providers"]


def test_vdev_attention_backend_passes_the_attention_cases(tmp_path):
    args = ["conformance", "--platform", "vdev", "--checks", "attention", "--providers", "VDEV",
            "--no-progress", "--report-dir", str(tmp_path)]
    proc = run_python(CLI, env={"OPCORE_VDEV": "1"}, args=args, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    cases = [json.loads(line) for line in (tmp_path / "conformance.jsonl").read_text().splitlines()]
    cases = [c for c in cases if c.get("type") == "case"]
    assert cases and {c["provider"] for c in cases} == {"VDEV"}
    assert {c["status"] for c in cases} == {"pass"}
