"""The cpu plugin's `ipex` provider, in the dev venv (no IPEX installed there).

IPEX itself is exercised by plugins/cpu/scripts/verify_ipex.sh in a torch 2.8 venv (see
plugins/cpu/reports/ipex.md); here: registration is conditional, and each
``supports_args`` declines what IPEX's kernels do not handle.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from opcore.ir import ops
from opcore_plugin_cpu import ipex_provider as ipex

needs_no_ipex = pytest.mark.skipif(
    importlib.util.find_spec("intel_extension_for_pytorch") is not None,
    reason="IPEX is installed in this venv",
)


@needs_no_ipex
def test_ipex_provider_not_registered_without_ipex():
    assert ipex.REGISTERED is False
    assert "intel_extension_for_pytorch" in ipex.IMPORT_ERROR
    for name in (
        "rms_norm",
        "fused_add_rms_norm",
        "silu_and_mul",
        "gelu_and_mul",
        "rotary_embedding",
    ):
        assert "ipex" not in getattr(ops, name).impls


def test_ipex_supports_args_norms():
    x = torch.empty(4, 64, dtype=torch.bfloat16)
    w = torch.empty(64, dtype=torch.bfloat16)
    assert ipex.supports_rms_norm(x, w, 1e-6) is True
    assert ipex.supports_rms_norm(x, None, 1e-6) is False  # IPEX has no weight-less RMSNorm
    assert ipex.supports_rms_norm(x, w, 1e-6, 32) is False  # nor variance_size
    assert ipex.supports_rms_norm(x, w.float(), 1e-6) is False  # weight dtype must match
    # Layout never decides (strided inputs are made dense by the provider).
    strided = torch.empty(4, 192, dtype=torch.bfloat16)[:, 64:128]
    assert ipex.supports_rms_norm(strided, w, 1e-6) is True
    assert ipex.supports_fused_add_rms_norm(x, x.clone(), w, 1e-6) is True
    assert ipex.supports_fused_add_rms_norm(x, x.float(), w, 1e-6) is False


def test_ipex_supports_args_rotary_excludes_bf16_gptj_bad_head_sizes():
    def args(dtype, head, is_neox, key=True, rot=None):
        pos = torch.zeros(5, dtype=torch.int64)
        q = torch.empty(5, 2 * head, dtype=dtype)
        k = torch.empty(5, 2 * head, dtype=dtype) if key else None
        cache = torch.empty(32, rot or head)
        return pos, q, k, head, cache, is_neox

    assert ipex.supports_rotary_embedding(*args(torch.bfloat16, 128, False)) is True
    assert ipex.supports_rotary_embedding(*args(torch.bfloat16, 80, True)) is True
    # IPEX 2.8 returns NaN for bf16 GPT-J style at head sizes that are not multiples of 32.
    assert ipex.supports_rotary_embedding(*args(torch.bfloat16, 80, False)) is False
    assert ipex.supports_rotary_embedding(*args(torch.float16, 80, False)) is True
    assert ipex.supports_rotary_embedding(*args(torch.float32, 64, True, key=False)) is False
    assert ipex.supports_rotary_embedding(*args(torch.float32, 64, True, rot=32)) is False


def test_ipex_supports_args_gated():
    assert ipex.supports_silu_and_mul(torch.empty(3, 8)) is True
    assert ipex.supports_silu_and_mul(torch.empty(3, 7)) is False
    assert ipex.supports_gelu_and_mul(torch.empty(3, 8), "tanh") is True
    assert ipex.supports_gelu_and_mul(torch.empty(3, 8), "erf") is False


@needs_no_ipex
def test_cpu_default_priority_names_ipex_only_when_registered():
    from opcore_plugin_cpu.platform import CpuPlatform

    assert CpuPlatform().get_default_ir_op_priority(None) == {}
