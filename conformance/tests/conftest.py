"""Planted-defect plugins for the conformance self-tests, installed as real distributions.

Each helper writes a package and its ``.dist-info`` (``entry_points.txt`` included) into a
temporary site directory with `opcore.testing.make_distribution`; the suite then runs in a
fresh interpreter with that directory on ``PYTHONPATH``, so the plugins are discovered
through ``importlib.metadata`` exactly as after ``pip install``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opcore.testing import make_distribution

# Providers with one planted defect each, plus one correct provider. They are registered
# by an `opcore.general_plugins` entry point on the built-in ops.
PLANTED_PROVIDERS = """
import torch

from opcore.ir import ops


# The op's reference; each defect below departs from it in one way.
_rms = ops.rms_norm.native


def good(x, weight, epsilon, variance_size=None):
    return _rms(x, weight, epsilon, variance_size)


def eps_outside(x, weight, epsilon, variance_size=None):
    # DEFECT: epsilon added to the root instead of the variance.
    xf = x.float()
    xv = xf if variance_size is None else xf[..., :variance_size]
    out = xf / (torch.sqrt(xv.pow(2).mean(dim=-1, keepdim=True)) + epsilon)
    if weight is not None:
        out = out * weight.float()
    return out.to(x.dtype)


def wrong_dtype(x, weight, epsilon, variance_size=None):
    # DEFECT: returns the fp32 accumulator instead of casting back.
    return _rms(x, weight, epsilon, variance_size).float()


def rows_contiguous(x, weight, epsilon, variance_size=None):
    # DEFECT: reads the rows as if the tensor were contiguous (ignores the row stride).
    packed = torch.empty(x.shape).stride()
    x = x.as_strided(x.shape, packed, x.storage_offset())
    return _rms(x, weight, epsilon, variance_size)


def mutates(x, weight, epsilon, variance_size=None):
    # DEFECT: not declared in-place, yet scales its input.
    out = _rms(x, weight, epsilon, variance_size)
    x.mul_(2)
    return out


def reads_values(x, weight, epsilon, variance_size=None):
    # DEFECT (in supports_args): decides from tensor values.
    return bool(x.abs().max() < 1e30)


def returns_symbool(x, weight, epsilon, variance_size=None):
    # DEFECT (in supports_args): a size comparison returned as is; under dynamic shapes
    # (symbolic sizes) that is a SymBool, not a bool.
    return x.shape[-1] >= 1


def rotary_ignores_style(positions, query, key, head_size, cos_sin_cache, is_neox):
    # DEFECT: always rotates NeoX-style.
    return ops.rotary_embedding.native(positions, query, key, head_size, cos_sin_cache, True)


def _layers():
    from opcore.layers import RMSNorm, RotaryEmbedding

    @RMSNorm.register_oot
    class PlantedRMSNorm(RMSNorm):
        def forward_oot(self, x, residual=None):
            # DEFECT: ignores the learned weight.
            if residual is not None:
                return ops.fused_add_rms_norm(x, residual, None, self.variance_epsilon)
            return ops.rms_norm(x, None, self.variance_epsilon)

    @RotaryEmbedding.register_oot
    class PlantedRotary(RotaryEmbedding):
        def forward_oot(self, positions, query, key=None):  # correct
            return ops.rotary_embedding(positions, query, key, self.head_size, self.cos_sin_cache,
                                        self.is_neox)


def register():
    if "planted_good" in ops.rms_norm.impls:
        return  # idempotent: general plugins run once per process, but be safe
    _layers()
    ops.rms_norm.register_impl("planted_good")(good)
    ops.rms_norm.register_impl("planted_eps")(eps_outside)
    ops.rms_norm.register_impl("planted_dtype")(wrong_dtype)
    ops.rms_norm.register_impl("planted_rows")(rows_contiguous)
    ops.rms_norm.register_impl("planted_mutates")(mutates)
    ops.rms_norm.register_impl("planted_values", supports_args=reads_values)(good)
    ops.rms_norm.register_impl("planted_symbool", supports_args=returns_symbool)(good)
    ops.rotary_embedding.register_impl("planted_style")(rotary_ignores_style)
"""

# An out-of-tree platform on the CPU device that claims a dtype the CPU cannot compute in,
# and carries a stale and a misspelled member.
PLANTED_PLATFORM = """
import torch

from opcore_plugin_cpu.platform import CpuPlatform


class PlantedPlatform(CpuPlatform):
    name = "planted"
    # DEFECT: the CPU cannot add or multiply float8_e4m3fn tensors.
    supported_dtypes = (torch.float32, torch.float8_e4m3fn)

    def is_cuda(self):  # DEFECT: a stale member the core never calls
        return False

    def get_device_nmae(self, index=0):  # DEFECT: misspelled get_device_name
        return "planted"

    def get_device_total_memory(self, index=0, *, unit):  # DEFECT: a keyword the core never passes
        return 1 << 30


def probe():
    return "planted_platform.PlantedPlatform"
"""


@pytest.fixture(scope="session")
def planted_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("planted-site")
    make_distribution(
        site,
        "opcore-planted-providers",
        entry_points={"opcore.general_plugins": {"planted": "planted_providers:register"}},
        files={"planted_providers.py": PLANTED_PROVIDERS},
    )
    make_distribution(
        site,
        "opcore-plugin-planted",
        entry_points={"opcore.platform_plugins": {"planted": "planted_platform:probe"}},
        files={"planted_platform.py": PLANTED_PLATFORM},
    )
    return site


def _run_suite(
    args: list[str],
    *,
    site: Path,
    report_dir: Path,
    module: str = "opcore_conformance",
    env: dict[str, str] | None = None,
    timeout: float = 170,
) -> subprocess.CompletedProcess:
    """Run ``python -m <module> <args>`` in a fresh interpreter with ``site`` on the path."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    full_env.update(env or {})
    cmd = [sys.executable, "-m", *module.split(), *args]
    if "--opcore-report-dir" not in " ".join(args) and module != "pytest":
        cmd += ["--report-dir", str(report_dir)]
    return subprocess.run(
        cmd, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=report_dir.parent
    )


def _read_statuses(report_dir: Path) -> dict[str, dict]:
    records = {}
    for line in (report_dir / "conformance.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "case":
            records[rec["id"]] = rec
    return records


@pytest.fixture(scope="session")
def run_suite():
    """``run_suite(args, site=, report_dir=, module="opcore_conformance")`` -> CompletedProcess."""
    return _run_suite


@pytest.fixture(scope="session")
def read_statuses():
    """``read_statuses(report_dir)`` -> ``{case id: JSONL record}``."""
    return _read_statuses
