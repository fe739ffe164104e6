"""The H200 tuning table this plugin ships (docs/tuning.md), loaded the way a process on an
H200 loads it: found through the ``opcore.tuning_tables`` entry point, every bucket's
launch configuration served to the Triton launchers, no provider reordered; stale (another
torch version, a provider whose source changed) it is left out with one warning.

This machine has no H200: the tuning environment (device, capability, versions) is a
stand-in returning the table's own, in a child process (the Triton providers register
under the interpreter before the table loads; nothing is launched)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

TABLES = Path(__file__).resolve().parents[1] / "src" / "opcore_plugin_cuda" / "tuning"
SHIPPED = sorted(TABLES.glob("*.json"))

CHILD = r"""
import json, os, sys, warnings
import opcore.kernels.triton, opcore.kernels.triton.batch_invariant  # the cuda providers
import torch
import opcore.tuning as tuning
from opcore.tuning import runtime
from opcore_plugin_cuda.platform import CudaPlatform

doc = json.load(open(sys.argv[1]))
here = dict(doc["environment"])
runtime.environment = lambda: dict(here)  # stand-in for the H200


def load():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = tuning.reload()
    msgs = [str(c.message) for c in caught if c.category is tuning.TuningWarning]
    return state, msgs


def configs():
    out = []
    for e in doc["entries"]:
        got = tuning.launch_config(e["op"], "triton", getattr(torch, e["dtype"]), e["tokens"],
                                   tuple(e["shape"]))
        out.append(None if got is None else dict(got))
    return out


def order_note():
    x, w = torch.empty(1, 4096, dtype=torch.bfloat16), torch.empty(4096, dtype=torch.bfloat16)
    return runtime.explain_note("rms_norm", "triton_batch_invariant", (x, w, 1e-6))


out = {}
state, msgs = load()
out["found"] = {"used": state.used, "stale": state.stale, "warnings": msgs,
                "configs": configs(), "identity": tuning.identity(), "note": order_note()}
out["nearest_2048"] = dict(tuning.launch_config("rms_norm", "triton", torch.bfloat16,
                                                 2048, (4096,)) or {})
out["cuda_priority"] = CudaPlatform().get_default_ir_op_priority(None)
# Widths nobody tuned: Qwen2.5-7B's 3584 (the model's 4096-column tile, as at 4096) and
# 9728 (the model picks another column tile than at 14336 or 28672: nothing is lent).
out["lent"] = {f"{op} {list(shape)} {t}": dict(tuning.launch_config(
    op, "triton", torch.bfloat16, t, shape) or {}) for op, shape, t in (
    ("rms_norm", (3584,), 1), ("rms_norm", (3584,), 4096), ("silu_and_mul", (9728,), 4096))}

here["torch"] = "0.0.0"  # the same device, another torch
state, msgs = load()
out["other_torch"] = {"used": state.used, "stale": state.stale, "warnings": msgs,
                      "configs": configs()}
here["torch"] = doc["environment"]["torch"]

changed = dict(doc)
changed["providers"] = {op: dict(p) for op, p in doc["providers"].items()}
changed["providers"]["rms_norm"]["triton"] = "0" * 64  # as if norm.py had changed since
path = sys.argv[2]
json.dump(changed, open(path, "w"))
os.environ["OPCORE_TUNING"] = path
state, msgs = load()
out["changed"] = {"used": state.used, "stale": state.stale, "warnings": msgs,
                  "configs": configs(), "note": order_note()}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda p: p.name)
def test_shipped_table_applies_on_a_stand_in_h200_and_is_left_out_when_stale(shipped, tmp_path):
    doc = json.loads(shipped.read_text())
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPCORE_PLATFORM": "cpu",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}  # fmt: skip
    env.pop("OPCORE_TUNING", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(shipped), str(tmp_path / "changed.json")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    want = [e["configs"].get("triton") for e in doc["entries"]]

    # found through the entry point, fresh: every tuned bucket's configuration is served
    found = out["found"]
    assert found["used"] == [f"opcore_plugin_cuda.tuning/{shipped.name} (opcore.tuning_tables: "
                             "cuda)"], found  # fmt: skip
    assert found["stale"] == [] and found["warnings"] == []
    assert found["configs"] == want and all(c is not None for c in want)
    assert found["identity"] not in ("off", "search", "env")
    # 2048 tokens: the nearest tuned bucket (4096)
    e4096 = next(e for e in doc["entries"] if e["op"] == "rms_norm"
                 and e["tokens"] == 4096 and e["shape"] == [4096])  # fmt: skip
    assert out["nearest_2048"] == e4096["configs"]["triton"]

    # a width nobody tuned borrows the nearest tuned width the launch model treats alike
    def entry(op, shape, tokens):
        return next(e for e in doc["entries"] if e["op"] == op and e["shape"] == shape
                    and e["tokens"] == tokens)["configs"]["triton"]  # fmt: skip

    def entry_or_none(op, shape, tokens):  # a bucket with no entry lends nothing
        found = [
            e for e in doc["entries"] if (e["op"], e["shape"], e["tokens"]) == (op, shape, tokens)
        ]
        return found[0]["configs"]["triton"] if found else {}

    assert out["lent"] == {
        "rms_norm [3584] 1": entry_or_none("rms_norm", [4096], 1),
        "rms_norm [3584] 4096": entry("rms_norm", [4096], 4096),
        "silu_and_mul [9728] 4096": {},
    }
    # no provider is reordered: each bucket's measured order is the platform's own, so
    # dispatch builds no router for these ops (no per-call cost)
    for e in doc["entries"]:
        assert e["order"] == out["cuda_priority"][e["op"]], e["op"]

    # another torch on the same device: the whole table is stale, one warning, nothing used
    other = out["other_torch"]
    assert other["used"] == [] and len(other["warnings"]) == 1
    assert "environment differs (torch: table" in other["warnings"][0]
    assert other["configs"] == [None] * len(want)

    # one provider's source changed: its parts are left out, one warning, the rest applies
    changed = out["changed"]
    assert (
        len(changed["warnings"]) == 1
        and "rms_norm/triton (identity changed)" in (changed["warnings"][0])
    )
    for e, got, cfg in zip(doc["entries"], changed["configs"], want, strict=True):
        assert got == (None if e["op"] == "rms_norm" else cfg), e["op"]
    # and its buckets' measured order is dropped whole: the rest of it would have put
    # triton_batch_invariant first, an order nobody measured
    assert "provider order ['triton', 'triton_batch_invariant', 'native']" in found["note"]
    assert changed["note"] is None
