"""Whether torch can make tensors of a platform's device type in this process.

A platform may activate while torch does not know its device type: an accelerator whose
torch extension (the code that renames PrivateUse1 to ``npu``, ``hpu``, ...) is not
installed or not imported, or a scaffolded plugin whose stand-in is off. torch then fails
deep inside the first device call (``Expected one of cpu, cuda, ... device type at start
of device string``, ``module 'torch' has no attribute ...``). `device_type_problem` says it
in one line instead, naming the plugin and what to install or switch on; ``opcore info``
and the conformance suite print it.
"""

from __future__ import annotations

from typing import Any

import torch


def standin_env(platform_name: str) -> str:
    """The stand-in switch of a plugin scaffolded by ``opcore new-plugin NAME``."""
    return f"OPCORE_{platform_name.upper()}_STANDIN"


def device_type_problem(platform: Any, distribution: str | None = None) -> str | None:
    """``None`` when torch knows ``platform.device_type`` here (it parses as a device and,
    for a non-builtin type, ``torch.<type>`` is its device module); otherwise one line
    naming the platform (and ``distribution``) and the remedies."""
    device_type = getattr(platform, "device_type", "") or ""
    try:
        torch.device(device_type)
    except (RuntimeError, TypeError):
        missing = "torch does not know it in this process"
    else:
        if device_type != torch._C._get_privateuse1_backend_name() or hasattr(torch, device_type):
            return None
        missing = f"torch knows the name but has no device module torch.{device_type}"
    name = getattr(platform, "name", "?")
    if distribution is None:
        distribution = _distribution_of(name)
    owner = f" ({distribution})" if distribution else ""
    return (
        f"platform {name!r}{owner} uses device type {device_type!r}, but {missing}: install "
        f"and import the torch extension that provides {device_type!r} devices, or, for a "
        f"plugin made by `opcore new-plugin`, switch on its stand-in ({standin_env(name)}=1), "
        f"which runs it on opcore's virtual device renamed to {device_type!r}"
    )


def _distribution_of(platform_name: str) -> str | None:
    """The installed distribution that provides platform ``platform_name``, when this
    process has resolved its platform (never resolves by itself)."""
    import opcore.platforms as P

    if not P.is_resolved():
        return None
    try:
        for cand in P.explain().candidates:
            if cand.name == platform_name:
                return cand.distribution
    except Exception:  # a failed resolution: the name alone still says which plugin
        return None
    return None
