"""The `{{ cookiecutter.plugin_name }}` provider of opcore ops.

Importing this module registers the providers; `{{ cookiecutter.__class_prefix }}Platform.import_ir_kernels`
imports it once, only when this platform is the current one. A provider has exactly the
native function's parameters and computes the same thing; opcore-conformance checks it
against the native reference on your device.

The example below is plain torch, so it runs wherever torch does. Replace its body with a
call into your kernel library, keep `_supports_rms_norm` honest about what the kernel
accepts, and add providers for the other ops (`opcore info` lists them).

Providers are traced by torch.compile: no Python control flow on sizes. A body that turns
a size into a Python int (`int(x.shape[0])`, `if x.shape[0] > 8`, `range(n)`) pins it, and a
model compiled with a dynamic batch fails; decide on sizes in `_supports_rms_norm` or in
the kernel launch instead.
"""

from __future__ import annotations

import torch
from opcore.ir import ops

from {{ cookiecutter.__module_name }} import PROVIDER

DEVICE_TYPE = "{{ cookiecutter.device_type }}"
# The dtypes the kernel accepts; anything else goes to the next provider in priority.
RMS_NORM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _supports_rms_norm(x, weight, epsilon, variance_size=None) -> bool:
    """Decided from metadata only (it also runs on fake tensors while torch.compile traces),
    and always a plain bool: with dynamic shapes, sizes are SymInts, so wrap any size
    comparison in bool()."""
    return x.device.type == DEVICE_TYPE and x.dtype in RMS_NORM_DTYPES


# supported: static availability. A kernel library would pass whether it imported.
# properties: what the kernel guarantees by construction (docs/properties.md), which
# `opcore conformance` checks on the device. This body has no atomics, so it is
# deterministic; whether a row's bits depend on the batch (batch_invariant) depends on how
# the device's reduction splits a row, and capture_safe on its graph mechanism: declare
# those once the checks have measured them on your device (they report "could claim").
@ops.rms_norm.register_impl(
    PROVIDER, supported=True, supports_args=_supports_rms_norm, properties={"deterministic"}
)
def rms_norm(x, weight, epsilon, variance_size=None):
    """RMS normalization over the last dim: fp32 math (fp64 for fp64 input), then cast
    back to the input dtype, like the native reference."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xc = x.to(compute)
    head = xc if variance_size is None else xc[..., :variance_size]
    inv_rms = torch.rsqrt(head.square().mean(dim=-1, keepdim=True) + epsilon)
    out = xc * inv_rms
    if weight is not None:
        out = out * weight.to(compute)
    return out.to(x.dtype)
