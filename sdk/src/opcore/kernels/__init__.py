"""Kernel packages shipped with the core, and the facts about them that platforms read.

`opcore.kernels.triton` holds the portable Triton providers shared by the cuda, rocm and
xpu platforms. Importing a kernel package registers its providers on `opcore.ir` ops.

Importing this module itself builds nothing and imports nothing of opcore: platforms (and
the attention backend ``TRITON_PAGED``) read from here which ops the Triton provider
covers, which torch device types Triton drives and the default priority of a platform
whose kernels are Triton's, without registering or compiling anything.
"""

from __future__ import annotations

# The fp8 quantization ops (docs/ops.md), each with a Triton kernel in
# `opcore.kernels.triton.quant`.
FP8_OPS = (
    "scaled_fp8_quant",
    "dynamic_per_token_scaled_fp8_quant",
    "per_token_group_quant_fp8",
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
    "rms_norm_dynamic_per_token_quant",
    "silu_and_mul_fp8_quant",
    "silu_and_mul_per_token_group_fp8_quant",
)

# The mixture-of-experts ops (docs/ops.md#mixture-of-experts), each with a Triton kernel in
# `opcore.kernels.triton.moe`.
MOE_OPS = ("topk_softmax", "grouped_topk", "fused_experts")

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
    *FP8_OPS,
    *MOE_OPS,
)

# Triton backend name -> the torch device type whose tensors that backend drives (nvidia
# and amd both drive torch's "cuda" device type).
TRITON_BACKEND_DEVICE_TYPES = {"nvidia": "cuda", "amd": "cuda", "intel": "xpu"}


def triton_default_priority() -> dict[str, list[str]]:
    """The default provider order of a platform whose kernels are `opcore.kernels.triton`
    (cuda and rocm): ``triton``, then ``triton_batch_invariant`` where that provider exists
    (it runs where a config requires batch_invariant, which triton's norms do not declare:
    docs/properties.md), then ``native``, for every op of `TRITON_OPS`.

    Call it from ``get_default_ir_op_priority``, after ``import_ir_kernels`` imported the
    kernel packages (it reads the batch-invariant variant's ops from there)."""
    from opcore.kernels.triton import batch_invariant

    return {
        op: ["triton", batch_invariant.PROVIDER, "native"]
        if op in batch_invariant.OPS
        else ["triton", "native"]
        for op in TRITON_OPS
    }
