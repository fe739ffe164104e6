"""A virtual accelerator on PyTorch's PrivateUse1 key, in pure Python.

`install` renames PrivateUse1 to a device type of the caller's choice (``"vdev"`` for
opcore's own ``vdev`` platform, ``"nimbus"`` for a scaffolded plugin's stand-in), and
registers what torch expects of a backend: a device module (``torch.<device_type>``:
``device_count``, ``is_available``, ``current_device``, ``set_device``, ``synchronize``,
``get_device_properties``, memory statistics), PrivateUse1 hooks, a device guard, and one
boxed kernel for every aten op at the PrivateUse1 key (`opcore.vdev._kernels`). Tensors
on it are real PrivateUse1 tensors with their own sizes, strides, storage offsets and
shared storages; their bytes live in host memory and the kernels compute with torch's CPU
kernels on host views of them. So code written for an accelerator (opcore's ops registered
at CompositeExplicitAutograd, providers, attention backends, the conformance suite's
device handling, ``torch.compile`` with the ``eager``/``aot_eager`` backends) runs end to
end on a device type torch does not know, on any machine.

Like hardware, it is configurable: how many devices, which floating dtypes it computes
(others are refused, allocation included), how much memory each device has
(``torch.OutOfMemoryError`` past it). What it does not do: code generation (Inductor has
no backend for it), streams and events (everything is synchronous), random number
generation on the device, and every aten op outside `SUPPORTED_OPS`, which raises a
one-line ``NotImplementedError`` naming the op.

PrivateUse1 can be renamed once per process: a second `install` under another name, or
after another backend took PrivateUse1, raises `VirtualDeviceError` naming both.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping

import torch

from opcore.vdev._device import (
    DeviceGuard,
    DeviceModule,
    PrivateUse1Hooks,
    VirtualDevice,
    VirtualDeviceConfig,
)
from opcore.vdev._kernels import SUPPORTED_OPS, UnsupportedOpError, VirtualKernels

__all__ = [
    "DEFAULT_DTYPES",
    "ENV_DEVICES",
    "ENV_DTYPES",
    "ENV_MEMORY",
    "SUPPORTED_OPS",
    "UnsupportedOpError",
    "VirtualDevice",
    "VirtualDeviceConfig",
    "VirtualDeviceError",
    "install",
    "installed",
    "settings_from_env",
]

# No float64 by default: a device that does not compute it is the case to exercise (the
# conformance suite keeps its float64 reference on the CPU).
DEFAULT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# The virtual device's settings from the environment, whatever its device type is named.
ENV_DEVICES = "OPCORE_VDEV_DEVICES"  # device count, default 1
ENV_DTYPES = "OPCORE_VDEV_DTYPES"  # comma-separated floating dtypes, default DEFAULT_DTYPES
ENV_MEMORY = "OPCORE_VDEV_MEMORY"  # bytes per device, with an optional K/M/G suffix (1024s)

_DEVICE_TYPE = re.compile(r"^[a-z][a-z0-9_]*$")
_UNSET = "privateuseone"  # torch's PrivateUse1 name before any rename


class VirtualDeviceError(RuntimeError):
    """The virtual device cannot be installed as asked (bad settings, or PrivateUse1
    already taken under another name)."""


_lock = threading.Lock()
_installed: VirtualDevice | None = None
_library: torch.library.Library | None = None  # keeps the fallback registered


def installed() -> VirtualDevice | None:
    """The virtual device installed in this process, or ``None``."""
    return _installed


def install(
    device_type: str = "vdev",
    devices: int = 1,
    dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES,
    memory_bytes: int | None = None,
    name: str | None = None,
) -> VirtualDevice:
    """Install the virtual device as ``device_type`` (idempotent for equal settings).

    ``devices``: device count (``<device_type>:0`` ... ``:devices-1``). ``dtypes``: the
    floating dtypes it computes; tensors of other floating dtypes cannot be made on it.
    ``memory_bytes``: each device's memory (``None``: unbounded). ``name``: what
    ``get_device_name`` answers.
    """
    global _installed, _library
    config = _config(device_type, devices, dtypes, memory_bytes, name)
    with _lock:
        if _installed is not None:
            if _installed.config == config:
                return _installed
            raise VirtualDeviceError(
                f"cannot install the virtual device as {_describe(config)}: it is already "
                f"installed in this process as {_describe(_installed.config)}, and torch's "
                f"PrivateUse1 backend can be renamed only once per process"
            )
        taken = torch._C._get_privateuse1_backend_name()
        if taken != _UNSET:
            raise VirtualDeviceError(
                f"cannot install the virtual device as {device_type!r}: torch's PrivateUse1 "
                f"backend is already renamed to {taken!r} in this process (by another "
                f"backend), and it can be renamed only once"
            )
        device = VirtualDevice(config)
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(
            device_type, DeviceModule(device), PrivateUse1Hooks(), DeviceGuard()
        )
        library = torch.library.Library("_", "IMPL")
        library.fallback(VirtualKernels(device), "PrivateUse1")
        _library, _installed = library, device
    _self_check(device)
    return device


def settings_from_env(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """`install`'s ``devices``, ``dtypes`` and ``memory_bytes`` from `ENV_DEVICES`,
    `ENV_DTYPES` and `ENV_MEMORY` (absent: the defaults). Raises ``ValueError`` naming
    the variable for a value it cannot read."""
    env = os.environ if environ is None else environ
    out: dict[str, object] = {}
    raw = env.get(ENV_DEVICES, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{ENV_DEVICES}={raw!r}: expected a device count of at least 1")
        out["devices"] = int(raw)
    raw = env.get(ENV_DTYPES, "").strip()
    if raw:
        dtypes = []
        for part in (p.strip() for p in raw.split(",")):
            dtype = getattr(torch, part, None)
            if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
                raise ValueError(f"{ENV_DTYPES}={raw!r}: {part!r} is not a torch floating dtype")
            dtypes.append(dtype)
        out["dtypes"] = tuple(dtypes)
    raw = env.get(ENV_MEMORY, "").strip()
    if raw:
        m = re.fullmatch(r"(\d+)\s*([KMG]?)i?B?", raw, flags=re.IGNORECASE)
        if m is None:
            raise ValueError(f"{ENV_MEMORY}={raw!r}: expected bytes, e.g. 1073741824 or 1G")
        scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
        out["memory_bytes"] = int(m.group(1)) * scale
    return out


def _config(device_type, devices, dtypes, memory_bytes, name) -> VirtualDeviceConfig:
    if not isinstance(device_type, str) or not _DEVICE_TYPE.match(device_type):
        raise VirtualDeviceError(f"device_type {device_type!r}: expected a lowercase identifier")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise VirtualDeviceError(f"devices={devices!r}: expected an int of at least 1")
    dtypes = tuple(dtypes)
    for d in dtypes:
        if not isinstance(d, torch.dtype) or not d.is_floating_point:
            raise VirtualDeviceError(f"dtypes: {d!r} is not a torch floating dtype")
    if memory_bytes is not None and (not isinstance(memory_bytes, int) or memory_bytes < 0):
        raise VirtualDeviceError(
            f"memory_bytes={memory_bytes!r}: expected bytes (an int >= 0) or None"
        )
    return VirtualDeviceConfig(
        device_type=device_type,
        devices=devices,
        dtypes=dtypes,
        memory_bytes=memory_bytes,
        name=name or f"opcore virtual device ({device_type})",
    )


def _describe(config: VirtualDeviceConfig) -> str:
    dtypes = ",".join(str(d).replace("torch.", "") for d in config.dtypes)
    return (
        f"{config.device_type!r} (devices={config.devices}, dtypes={dtypes}, "
        f"memory_bytes={config.memory_bytes})"
    )


def _self_check(device: VirtualDevice) -> None:
    """One round trip through the device, so that a torch whose PrivateUse1 plumbing
    differs fails here with the reason rather than in the first kernel."""
    try:
        host = torch.arange(4, dtype=torch.float32)
        back = (host.to(device.device_type) * 2).cpu()
        ok = torch.equal(back, host * 2)
    except Exception as exc:
        raise VirtualDeviceError(
            f"the virtual device {device.device_type!r} failed its self-check on torch "
            f"{torch.__version__}: {type(exc).__name__}: {exc}"
        ) from exc
    if not ok:
        raise VirtualDeviceError(
            f"the virtual device {device.device_type!r} failed its self-check on torch "
            f"{torch.__version__}: a round trip changed the values"
        )
