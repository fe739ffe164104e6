"""Kernel packages shipped with the core.

`opcore.kernels.triton` holds the portable Triton providers shared by the cuda, rocm and
xpu platforms. Importing a kernel package registers its providers on `opcore.ir` ops.
"""

# The ops that provider ``triton`` (`opcore.kernels.triton`) registers on. Platforms name
# them in their default priorities from here, which builds nothing: importing the kernel
# package itself registers the provider and, with a GPU, compiles for it.
TRITON_OPS = (
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "gelu_and_mul",
    "rotary_embedding",
    "split_qkv_rmsnorm_rope",
    "scaled_fp8_quant",
    "dynamic_per_token_scaled_fp8_quant",
    "per_token_group_quant_fp8",
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
    "rms_norm_dynamic_per_token_quant",
    "silu_and_mul_fp8_quant",
    "silu_and_mul_per_token_group_fp8_quant",
)
