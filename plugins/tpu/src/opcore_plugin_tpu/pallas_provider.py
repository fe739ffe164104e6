"""Provider ``pallas``: Pallas TPU kernels, as XLA custom calls inside the lazy graph.

Registered on ``rms_norm``. ``supported`` is true only on a real TPU with JAX importable:
a Pallas TPU kernel lowers to a Mosaic custom call that XLA:CPU cannot run. The kernel
itself (`opcore_plugin_tpu.pallas_kernels`) is checked in Pallas' interpreter and lowered
for TPU on a CPU host by ``plugins/tpu/scripts/check_pallas.py``.

It is opt-in (the platform's default priority is native): name it in
``OPCORE_IR_OP_PRIORITY="rms_norm=pallas"``.
"""

from __future__ import annotations

import importlib.util

import torch

from opcore.ir import ops
from opcore_plugin_tpu.platform import on_real_tpu

PROVIDER = "pallas"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def jax_importable() -> bool:
    return importlib.util.find_spec("jax") is not None


SUPPORTED = on_real_tpu() and jax_importable()


def _supports_rms_norm(x, weight, epsilon, variance_size=None) -> bool:
    return (
        x.device.type == "xla"
        and x.dtype in DTYPES
        and x.dim() >= 2
        and (weight is None or (weight.device == x.device and weight.dtype == x.dtype))
    )


@ops.rms_norm.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_supports_rms_norm)
def rms_norm(x, weight, epsilon, variance_size=None):
    import torch_xla
    from torch_xla.experimental.custom_kernel import trace_pallas

    from opcore_plugin_tpu import pallas_kernels as k

    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    w2 = None if weight is None else weight.reshape(1, hidden)
    block_rows = k.pick_block_rows(x2.shape[0], hidden, x.element_size())
    args = (x2,) if w2 is None else (x2, w2)
    # The payload (the Mosaic kernel) is cached per shape/dtype/static arguments, so
    # steady-state calls add one custom-call node to the lazy graph and nothing else.
    payload, tensors = trace_pallas(
        k.rms_norm,
        *args,
        *(() if w2 is not None else (None,)),
        epsilon=float(epsilon),
        variance_size=variance_size,
        block_rows=block_rows,
        static_argnames=["epsilon", "variance_size", "block_rows", "interpret"],
        use_cache=True,
    )
    (out,) = torch_xla._XLAC._xla_tpu_custom_call(tensors, payload, [x2.shape], [x2.dtype])
    return out.reshape(x.shape)
