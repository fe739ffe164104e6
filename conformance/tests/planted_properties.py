"""Providers with planted property defects, for the property checks' self-tests
(`test_conformance_properties.py`) and the device run (`bench/gpu/properties.sh`), loaded
with ``opcore conformance --import planted_properties``.

Both compute ``rms_norm`` correctly (within tolerance); each declares a property it lacks:

``planted_rowblock``
    declares ``batch_invariant`` but sums each row's squares in blocks whose width it
    picks from the number of rows (8 columns under 64 rows, 64 from there), so a row's
    sum is added up in another order in a large batch than alone.
``planted_item``
    declares ``capture_safe`` but reads a value back to the host (``.item()``) on every
    call, which a graph capture cannot record.
"""

from __future__ import annotations

import torch

from opcore.ir import ops


def _norm(x, weight, epsilon, variance_size, sum_squares):
    xf = x.float()
    v = xf.shape[-1] if variance_size is None else int(variance_size)
    var = sum_squares(xf[..., :v]) / v
    y = xf * torch.rsqrt(var + epsilon)[..., None]
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


@ops.rms_norm.register_impl(
    "planted_rowblock", properties={"batch_invariant", "deterministic", "capture_safe"}
)
def rms_norm_rowblock(x, weight, epsilon, variance_size=None):
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    block = 8 if rows < 64 else 64  # the defect: the reduction's blocking follows the rows

    def sum_squares(t):
        pad = (-t.shape[-1]) % block
        t = torch.nn.functional.pad(t * t, (0, pad))
        return t.reshape(*t.shape[:-1], -1, block).sum(-1).sum(-1)

    return _norm(x, weight, epsilon, variance_size, sum_squares)


@ops.rms_norm.register_impl("planted_item", properties={"capture_safe", "deterministic"})
def rms_norm_item(x, weight, epsilon, variance_size=None):
    # the defect: a host read-back on every call (a "guard" on the input's magnitude)
    if x.abs().max().item() > 1e30:
        raise ValueError("rms_norm: input too large")
    return _norm(x, weight, epsilon, variance_size, lambda t: (t * t).sum(-1))
