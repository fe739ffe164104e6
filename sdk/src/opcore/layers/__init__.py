"""opcore.layers: `CustomOp` / `PluggableLayer` and the reference layers.

- ``@CustomOp.register("rms_norm")`` names a layer; ``@RMSNorm.register_oot`` (or
  ``CustomOp.register_oot(name="rms_norm")``) lets a plugin replace it, keyed by that name,
  so ``RMSNorm(...)`` builds the replacement and ``-rms_norm`` still applies to it.
- Kernels have one route: ``forward_native`` calls `opcore.ir` ops and the platform's
  provider priority picks each op's kernel. Construction binds ``forward`` to a
  ``register_oot`` replacement's ``forward_oot`` when it defines one and ``custom_ops``
  (``config.compilation.custom_ops`` / ``OPCORE_CUSTOM_OPS``) enables the op, else to
  ``forward_native``. `binding_info()` reports each class's binding, route and why.
- `PluggableLayer`: whole-module replacement without ``forward_*`` dispatch.
- Reference layers: `RMSNorm`, `SiluAndMul`, `GeluAndMul`, `RotaryEmbedding` (with
  `build_cos_sin_cache`), `QKNormRoPE`; their ``forward_native`` calls `opcore.ir.ops`.
  `Attention` (a `PluggableLayer`) asks the attention selector and owns its KV cache.
  `FusedMoE` (a `PluggableLayer`): router (``topk_softmax`` / ``grouped_topk``) and
  ``fused_experts``, sharded over the intermediate dimension with ``group=``.
- Tensor parallel: `ColumnParallelLinear`, `RowParallelLinear` (ends in the ``all_reduce``
  op), over a process group named in `opcore.distributed`.
"""

from opcore.layers.activation import GeluAndMul, SiluAndMul
from opcore.layers.attention import Attention
from opcore.layers.custom_op import (
    CustomOp,
    PluggableLayer,
    binding_info,
    describe_route,
    registered_layers,
    resolve_binding,
)
from opcore.layers.moe import FusedMoE
from opcore.layers.norm import RMSNorm
from opcore.layers.parallel import ColumnParallelLinear, RowParallelLinear
from opcore.layers.rotary import QKNormRoPE, RotaryEmbedding, build_cos_sin_cache

__all__ = [
    "Attention",
    "ColumnParallelLinear",
    "CustomOp",
    "FusedMoE",
    "GeluAndMul",
    "PluggableLayer",
    "QKNormRoPE",
    "RMSNorm",
    "RotaryEmbedding",
    "RowParallelLinear",
    "SiluAndMul",
    "binding_info",
    "build_cos_sin_cache",
    "describe_route",
    "registered_layers",
    "resolve_binding",
]
