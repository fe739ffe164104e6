"""The Triton launchers refuse, before any launch, a tensor they cannot address as rows of
one stride, with one line naming the op and the argument. (The providers' supports_args
keep such tensors away; these are the errors a direct caller gets.) The checks run on
metadata only, so plain CPU tensors exercise them without a device or the interpreter."""

from __future__ import annotations

import pytest
import torch

from opcore.testing.interpreter import UNDER_TRITON_INTERPRETER, rerun_under_triton_interpreter

if not UNDER_TRITON_INTERPRETER:
    # Like every module that imports the Triton kernels, this one runs in a child: importing
    # them registers the `triton` providers in the importing process, and the main test
    # process stays without them (its compile tests define an opaque op per provider).

    def test_launcher_errors_in_a_child():
        rerun_under_triton_interpreter(__file__)

else:
    pytest.importorskip("triton")

    from opcore.kernels.triton import activation, norm, qk_norm_rope

    def column_major(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(cols, rows).t()  # last dim not contiguous

    CASES = [
        ("rms_norm: x", lambda: norm.rms_norm(column_major(4, 8), None, 1e-6)),
        (
            "fused_add_rms_norm: x_residual",
            lambda: norm.fused_add_rms_norm(torch.randn(4, 8), column_major(4, 8), None, 1e-6),
        ),
        (
            "fused_add_rms_norm: x",
            lambda: norm.fused_add_rms_norm_inplace(
                column_major(4, 8), torch.randn(4, 8), None, 1e-6
            ),
        ),
        ("silu_and_mul: x", lambda: activation.silu_and_mul(column_major(4, 8))),
        ("gelu_and_mul: x", lambda: activation.gelu_and_mul(column_major(4, 8), "tanh")),
        (
            "split_qkv_rmsnorm_rope: qkv",
            lambda: qk_norm_rope.split_qkv_rmsnorm_rope(
                column_major(3, 3 * 16),
                None,
                None,
                1e-6,
                torch.arange(3),
                torch.randn(8, 16),
                1,
                1,
                16,
                True,
            ),
        ),
    ]

    @pytest.mark.parametrize("what, call", CASES, ids=[c[0] for c in CASES])
    def test_a_tensor_that_is_not_rows_of_one_stride_is_refused_naming_op_and_argument(what, call):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"{what} of shape ")
        assert "cannot be addressed as rows with one stride and a contiguous last dim" in message
