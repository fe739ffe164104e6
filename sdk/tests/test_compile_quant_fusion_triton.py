"""The FP8 quantization fusions lowered to the ``triton`` provider (Triton's CPU
interpreter): each fused op in a compiled graph runs the fused Triton kernel (an opaque
call), in ``eager`` mode and under Inductor, and the outputs match the unfused graph
compiled on the ops' native functions within the fused ops' fp8 tolerance
(`opcore.compile.testing.quant_fusions_fire`).

The interpreter is chosen when a kernel is decorated, so it must be on before
`opcore.kernels.triton` is first imported: the collected test re-runs this file in a child
pytest with ``TRITON_INTERPRET=1`` (as ``test_compile_triton_interp.py`` does).
"""

from __future__ import annotations

import pytest
import torch

from opcore.testing.interpreter import UNDER_TRITON_INTERPRETER, rerun_under_triton_interpreter

FUSED = (
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
    "rms_norm_dynamic_per_token_quant",
    "silu_and_mul_fp8_quant",
    "silu_and_mul_per_token_group_fp8_quant",
)

if not UNDER_TRITON_INTERPRETER:

    def test_quant_fusions_with_triton_under_interpreter():
        rerun_under_triton_interpreter(__file__, env={"OMP_NUM_THREADS": "1"})

else:

    @pytest.fixture(autouse=True)
    def _fresh_dynamo():
        torch._dynamo.reset()
        yield
        torch._dynamo.reset()

    @pytest.mark.parametrize("mode", ["eager", "inductor"])
    def test_fused_ops_lower_to_the_triton_kernels(mode):
        import opcore.kernels.triton  # noqa: F401  (registers the provider off the GPU platforms)
        from opcore.compile.testing import quant_fusions_fire
        from opcore.ir import all_ops, ensure_kernels_loaded
        from opcore.settings import create_config, set_current_config

        ensure_kernels_loaded()
        missing = [n for n in FUSED if "triton" not in all_ops()[n].impls]
        assert not missing, f"no triton provider for {missing}"
        config = create_config(ir_op_priority={op: ["triton", "native"] for op in all_ops()})
        with set_current_config(config):
            metrics = quant_fusions_fire(mode=mode, dtype=torch.bfloat16)
        assert set(metrics["fusions"].values()) == {1}, metrics
        providers = metrics["providers"]
        assert set(providers) == set(FUSED), providers
        assert {p for ps in providers.values() for p in ps} == {"triton"}, providers
