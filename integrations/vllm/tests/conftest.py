"""The bridge's tests run in a venv with the real vLLM (sdk/tests/test_vllm_bridge.py builds
it): vLLM's CPU platform, the bridge installed (its real entry points), vLLM's general
plugins loaded once per session after the counting providers below are planted in opcore.

A missing vLLM is an error here, never a skip: these tests are the bridge's only check.
"""

from __future__ import annotations

import os

# Before vLLM is imported: its CPU platform (the wheel is a CUDA build; no GPU here), the
# opcore layers switched on for this process (another test checks them off).
os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ.setdefault("OPCORE_VLLM_LAYERS", "all")
os.environ.pop("OPCORE_VLLM_PRIORITY", None)

import collections  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import opcore.ir  # noqa: E402
from opcore.ir import ops  # noqa: E402

CALLS: collections.Counter = collections.Counter()


# A planted opcore provider per op the tests route: it counts, then computes what native does.
@ops.rms_norm.register_impl("counting")
def _rms_norm_counting(x, weight, epsilon, variance_size=None):
    CALLS["rms_norm"] += 1
    CALLS[f"rms_norm epsilon {type(epsilon).__name__}"] += 1
    return ops.rms_norm.native(x, weight, epsilon, variance_size)


# In place: writes its results into the activations (x, x_residual), as opcore's contract for
# ``inplace=True`` providers says.
@ops.fused_add_rms_norm.register_impl("counting", inplace=True)
def _fused_add_counting(x, x_residual, weight, epsilon, variance_size=None):
    CALLS["fused_add_rms_norm"] += 1
    out, residual = ops.fused_add_rms_norm.native(x, x_residual, weight, epsilon, variance_size)
    x.copy_(out)
    x_residual.copy_(residual)
    return x, x_residual


@ops.rotary_embedding.register_impl("counting")
def _rotary_counting(positions, query, key, head_size, cos_sin_cache, is_neox):
    CALLS["rotary_embedding"] += 1
    return ops.rotary_embedding.native(positions, query, key, head_size, cos_sin_cache, is_neox)


@pytest.fixture(scope="session", autouse=True)
def vllm_plugins_loaded():
    """vLLM loads its general plugins (the bridge's entry point among them), as its engine
    and workers do."""
    import vllm.plugins

    vllm.plugins.load_general_plugins()
    import opcore_vllm

    rep = opcore_vllm.report()
    assert rep is not None, "vLLM's load_general_plugins did not run opcore_vllm.register"
    return rep


@pytest.fixture
def calls():
    CALLS.clear()
    return CALLS


@pytest.fixture
def vllm_config():
    """A vLLM config in effect (vLLM's layers read it when built)."""
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

    def make(custom_ops=None, ir_op_priority=None):
        from vllm.config import KernelConfig
        from vllm.config.kernel import IrOpPriorityConfig

        kwargs = {}
        if custom_ops is not None:
            kwargs["compilation_config"] = CompilationConfig(custom_ops=custom_ops)
        if ir_op_priority is not None:
            kwargs["kernel_config"] = KernelConfig(
                ir_op_priority=IrOpPriorityConfig(**ir_op_priority)
            )
        cfg = VllmConfig(**kwargs)
        return cfg, set_current_vllm_config(cfg)

    return make


def pytest_report_header(config):
    import vllm

    return (
        f"vllm {vllm.__version__}, torch {torch.__version__}, opcore ops {len(opcore.ir.all_ops())}"
    )
