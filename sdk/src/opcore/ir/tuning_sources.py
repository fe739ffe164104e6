"""What the tuning index (`opcore.tuning.runtime`, a layer below ir) reads from the
layers above it: connected when `opcore.ir.dispatch` is imported."""

from __future__ import annotations

from typing import Any

import torch

from opcore import settings as _settings
from opcore.ir import registry
from opcore.platforms.kernels import ensure_kernels_loaded
from opcore.tuning import runtime as tuning_runtime


def tuning_environment() -> dict[str, Any]:
    """A tuning table's key for this process: the current platform's name, its device 0's
    name and capability, the torch and Triton versions (``None`` where there is none)."""
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    try:
        name: Any = platform.get_device_name(0)
    except Exception:
        name = None
    try:
        cap = platform.get_device_capability(0)
    except Exception:
        cap = None
    capability = None if cap is None else ".".join(str(c) for c in cap)
    try:
        import triton

        triton_version: Any = triton.__version__
    except Exception:
        triton_version = None
    return {
        "platform": platform.name,
        "device": name,
        "capability": capability,
        "torch": torch.__version__,
        "triton": triton_version,
    }


def _tuning_ops() -> dict[str, Any]:
    ensure_kernels_loaded()
    return {name: op for name, op in registry.OPS.items() if not op.collective}


def _required_properties() -> tuple[str, ...]:
    return tuple(_settings.get_current_config().kernel.required_properties or ())


def connect(generation: Any, invalidate: Any) -> None:
    """Hand the index its sources; ``generation`` / ``invalidate``: the registry
    generation's reader and its bump (`opcore.ir.dispatch`'s)."""
    tuning_runtime.connect(
        tuning_runtime.Sources(
            ops=_tuning_ops,
            environment=tuning_environment,
            required_properties=_required_properties,
            generation=generation,
            invalidate=invalidate,
        )
    )
