"""The built-in ops: ``opcore.ir.ops.<name>`` is the `opcore.ir.IrOp` of that name.

Each op is defined (its native function, validator, fake implementation and samples) in
one file of this package and imported here by name, so ``from opcore.ir.ops import
rms_norm`` leads a reader, an IDE or a type checker to its definition, and ``ops.rms_norm``
is a plain module attribute (one dict lookup on the hot path).

Ops that plugins or users register at run time are reached through the `IrOp` their
``register_op`` returned, or by name with `opcore.ir.get_op` / `opcore.ir.all_ops`;
``ops.<name>`` also finds them (PEP 562 ``__getattr__``; a slower lookup, about a
microsecond, so keep the `IrOp` in hot code). An unknown name is an ``AttributeError``
listing the registered ops.
"""

from opcore.ir.op import IrOp as _IrOp
from opcore.ir.op import all_ops as _all_ops
from opcore.ir.op import get_op as _get_op
from opcore.ir.ops._activation import gelu_and_mul, silu_and_mul
from opcore.ir.ops._moe import fused_experts, grouped_topk, topk_softmax
from opcore.ir.ops._norm import fused_add_rms_norm, rms_norm
from opcore.ir.ops._qkv import split_qkv_rmsnorm_rope
from opcore.ir.ops._quant import (
    dynamic_per_token_scaled_fp8_quant,
    fused_add_rms_norm_static_fp8_quant,
    per_token_group_quant_fp8,
    rms_norm_dynamic_per_token_quant,
    rms_norm_static_fp8_quant,
    scaled_fp8_quant,
    silu_and_mul_fp8_quant,
    silu_and_mul_per_token_group_fp8_quant,
)
from opcore.ir.ops._rotary import rotary_embedding

__all__ = [
    "dynamic_per_token_scaled_fp8_quant",
    "fused_add_rms_norm",
    "fused_add_rms_norm_static_fp8_quant",
    "fused_experts",
    "gelu_and_mul",
    "grouped_topk",
    "per_token_group_quant_fp8",
    "rms_norm",
    "rms_norm_dynamic_per_token_quant",
    "rms_norm_static_fp8_quant",
    "rotary_embedding",
    "scaled_fp8_quant",
    "silu_and_mul",
    "silu_and_mul_fp8_quant",
    "silu_and_mul_per_token_group_fp8_quant",
    "split_qkv_rmsnorm_rope",
    "topk_softmax",
]


def __getattr__(name: str) -> _IrOp:
    if name.startswith("__"):
        raise AttributeError(name)
    return _get_op(name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_all_ops()))
