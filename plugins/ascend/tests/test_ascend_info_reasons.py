"""`opcore info` on this machine (no NPU, no TPU, no Intel GPU, none of their runtimes)
lists the ascend, tpu and xpu plugins as inactive candidates, each with its reason."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) for m in ("torch_npu", "torch_xla")),
    reason="a vendor runtime is installed here",
)
def test_info_explains_why_ascend_tpu_and_xpu_are_inactive():
    from opcore.cli.info import collect

    data = collect()
    cands = {c["name"]: c for c in data["candidates"]}
    assert cands["ascend"]["tier"] == "out-of-tree"
    assert cands["tpu"]["tier"] == cands["xpu"]["tier"] == "in-tree"
    for name in ("ascend", "tpu", "xpu"):
        assert cands[name]["activated"] is False and cands[name]["error"] is None
    assert cands["ascend"]["reason"].startswith("torch_npu is not installed")
    assert cands["tpu"]["reason"].startswith("torch_xla is not installed")
    assert "XPU" in cands["xpu"]["reason"]
