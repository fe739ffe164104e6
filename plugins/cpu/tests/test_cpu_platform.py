"""CpuPlatform answers from the real machine."""

from __future__ import annotations

import os

import torch

from opcore.platforms.api_version import removed_members
from opcore_plugin_cpu import probe
from opcore_plugin_cpu.platform import CpuPlatform, usable_cores


def test_probe_names_the_class():
    assert probe() == "opcore_plugin_cpu.platform.CpuPlatform"


def test_real_answers():
    p = CpuPlatform()
    assert p.device_count() == 1
    assert p.core_count() == len(os.sched_getaffinity(0)) == usable_cores()
    assert p.get_device_total_memory() > 1 << 30
    assert p.dist_backend == "gloo"
    assert p.get_device_name()
    assert "plugin_api" in vars(type(p)) and p.plugin_api == ("2.0", "3.0")  # declared, API 2.0
    assert removed_members(type(p)) == {}  # nothing plugin API 2.0 removed


def test_claimed_dtypes_compute_on_this_cpu():
    p = CpuPlatform()
    for dtype in p.supported_dtypes:
        x = torch.randn(8, 8).to(dtype)
        y = (x @ x).float()
        ref = x.double() @ x.double()
        assert torch.allclose(y.double(), ref, atol=0.5, rtol=0.05), dtype
