"""Process groups by name: how a collective op finds its communicator.

An op's arguments must fit a ``torch.library`` schema, which has no type for a process
group, so collective ops take the group's *name* (a ``str``) and resolve it here. A name
is the same on every rank, hashable and printable (it appears in traces, logs and
``explain()``), and it says nothing about the backend, so one op serves every platform.

``init_distributed`` starts the default group with the platform's backend and registers it
as ``"world"``; `register_group` names any other group (a tensor-parallel subgroup, say).
Each name maps to one `Communicator` of the class the platform supplies
(``Platform.get_device_communicator_cls()``), or `TorchCommunicator`.
"""

from __future__ import annotations

import datetime
import importlib
import threading
from typing import Any

import torch
import torch.distributed as dist

from opcore.distributed.communicator import Communicator, TorchCommunicator

WORLD = "world"
DEFAULT_TIMEOUT_S = 60.0

_GROUPS: dict[str, Communicator] = {}
_lock = threading.Lock()


def communicator_class(platform: Any = None) -> type[Communicator]:
    """The `Communicator` class of ``platform`` (default: the current platform): the
    class its ``get_device_communicator_cls()`` names, or `TorchCommunicator` for
    ``None``. A path that does not import or names no `Communicator` subclass is a
    ``ValueError`` naming the platform and the path."""
    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    path = platform.get_device_communicator_cls()
    if path is None:
        return TorchCommunicator
    where = f"platform {platform.name!r}: get_device_communicator_cls() returned {path!r}"
    module_name, _, attr = str(path).rpartition(".")
    if not module_name:
        raise ValueError(f"{where}, not a dotted path 'package.module.Class'")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{where}, which does not import: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Communicator)):
        raise ValueError(f"{where}, which is {cls!r}, not a subclass of Communicator")
    return cls


def register_group(
    name: str,
    group: Any,
    *,
    device: torch.device | str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    platform: Any = None,
) -> Communicator:
    """Name ``group`` (a ``torch.distributed`` process group; ``None`` for the default
    one) for collective ops; returns its new communicator. Call it on every rank of the
    group with the same name. A name already registered is a ``ValueError``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a group name must be a non-empty str, got {name!r}")
    if not dist.is_initialized():
        raise RuntimeError(
            f"register_group({name!r}): torch.distributed is not initialized; call "
            f"opcore.distributed.init_distributed first"
        )
    cls = communicator_class(platform)
    comm = cls(group, torch.device(device), timeout_s=timeout_s, name=name)
    with _lock:
        if name in _GROUPS:
            raise ValueError(f"group name {name!r} is already registered ({_GROUPS[name]!r})")
        _GROUPS[name] = comm
    return comm


def get_communicator(name: str) -> Communicator:
    """The communicator registered as ``name``. An unknown name is a ``KeyError`` that
    lists the registered ones and says how a name is registered."""
    try:
        return _GROUPS[name]
    except KeyError:
        known = ", ".join(sorted(_GROUPS)) or "none"
        raise KeyError(
            f"no process group is registered as {name!r} in this process (registered: "
            f"{known}); opcore.distributed.init_distributed registers {WORLD!r}, "
            f"register_group any other"
        ) from None
    except TypeError:
        raise TypeError(f"a group name must be a str, got {type(name).__name__} {name!r}") from None


def group_names() -> list[str]:
    """The registered group names."""
    return sorted(_GROUPS)


def unregister_group(name: str) -> None:
    """Forget the name (the process group itself is left alone)."""
    with _lock:
        if _GROUPS.pop(name, None) is None:
            raise KeyError(f"no process group is registered as {name!r}")


def init_distributed(
    rank: int,
    world_size: int,
    *,
    init_method: str,
    device: torch.device | str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    backend: str | None = None,
    platform: Any = None,
) -> Communicator:
    """Start the default process group and register it as ``"world"``.

    ``backend`` defaults to the platform's ``dist_backend``; ``device`` to the
    platform's device ``rank % device_count()``, made the current device where the
    platform's torch device module has ``set_device``. ``timeout_s`` bounds the
    rendezvous and every collective (the process group's timeout and the communicator's
    host waits). Returns the world's communicator."""
    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    if device is None:
        count = max(1, platform.device_count())
        device = platform.device(rank % count)
    device = torch.device(device)
    if device.type != "cpu" and device.index is not None:
        module = getattr(torch, device.type, None)
        if module is not None and hasattr(module, "set_device"):
            module.set_device(device.index)
    dist.init_process_group(
        backend=backend or platform.dist_backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return register_group(WORLD, None, device=device, timeout_s=timeout_s, platform=platform)


def shutdown() -> None:
    """Forget every registered name and destroy the default process group (if any)."""
    with _lock:
        _GROUPS.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
