"""Fused projection weights: several `nn.Linear` with one input become one GEMM.

`fuse` concatenates the weights (and biases) of sibling linears along the output dim into
one non-persistent buffer of their owner, then points each linear's parameter at its slice
of that buffer (``param.data = view``). So the parameters keep their objects, names and
values, the state dict is unchanged, memory is not doubled, and an in-place write to a
parameter (``load_state_dict``) reaches the fused buffer too. `retie` re-points them after
``model.to(...)`` / ``.half()``, which convert parameters and buffers one by one.

`fusion_problem` says why a group cannot be fused (the caller then keeps separate GEMMs).
"""

from __future__ import annotations

import torch
import torch.nn as nn

_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


def buffer_names(name: str) -> tuple[str, str]:
    """The owner's buffer names for the fused weight and bias of group ``name``."""
    return f"_opcore_{name}_weight", f"_opcore_{name}_bias"


def fusion_problem(linears: list[nn.Linear]) -> str | None:
    """``None`` when ``linears`` can share one fused weight, else why not (one line)."""
    first = linears[0]
    for lin in linears:
        if type(lin) is not nn.Linear:
            return f"{type(lin).__name__} is not a plain torch.nn.Linear (quantized or wrapped)"
        if lin._forward_hooks or lin._forward_pre_hooks or "forward" in lin.__dict__:
            return "a projection has forward hooks or an instance-level forward"
        w = lin.weight
        if w.is_meta or w.dtype not in _FLOAT:
            return f"weight is {'on the meta device' if w.is_meta else str(w.dtype)}"
        if w.dtype != first.weight.dtype or w.device != first.weight.device:
            return "the projections' weights differ in dtype or device"
        if w.shape[1] != first.weight.shape[1]:
            return "the projections' input sizes differ"
        if (lin.bias is None) != (first.bias is None):
            return "some projections have a bias and some do not"
    return None


def fuse(owner: nn.Module, name: str, linears: list[nn.Linear]) -> None:
    """Register the fused weight (and bias) of ``linears`` on ``owner`` and point each
    linear's parameters at their slices of it."""
    wname, bname = buffer_names(name)
    with torch.no_grad():
        weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)
        bias = (
            None
            if linears[0].bias is None
            else torch.cat([lin.bias.detach() for lin in linears], dim=0)
        )
    owner.register_buffer(wname, weight, persistent=False)
    owner.register_buffer(bname, bias, persistent=False)
    retie(owner, name, linears)


def retie(owner: nn.Module, name: str, linears: list[nn.Linear]) -> None:
    """Point ``linears``' parameters at their slices of ``owner``'s fused buffers."""
    wname, bname = buffer_names(name)
    weight, bias = owner._buffers[wname], owner._buffers[bname]
    if weight is None:
        raise RuntimeError(f"{type(owner).__name__}: fused weight buffer {wname!r} is missing")
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        if lin.weight.data_ptr() != weight[start : start + rows].data_ptr():
            lin.weight.data = weight[start : start + rows]
        if bias is not None and lin.bias.data_ptr() != bias[start : start + rows].data_ptr():
            lin.bias.data = bias[start : start + rows]
        start += rows


def unfuse(owner: nn.Module, name: str) -> None:
    """Drop ``owner``'s fused buffers. The parameters keep their values (they stay views
    of the one storage, which lives on as long as they do)."""
    wname, bname = buffer_names(name)
    owner._buffers.pop(wname, None)
    owner._buffers.pop(bname, None)
