"""The declared `Platform` interface.

Every member the core calls is declared here, either with a documented default or as an
abstract method that a platform must answer. There is no passthrough to `torch.<device>`:
a member that is not declared here does not exist for the core.

A platform class is instantiated once per process (`opcore.platforms.current_platform`).
Members are plain methods; identity is class attributes.
"""

from __future__ import annotations

import abc
import contextlib
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from opcore.config import OpcoreConfig


class Platform(abc.ABC):
    """Base class of every opcore platform.

    Identity (class attributes):
      name: the plugin's entry-point name (``"cpu"``, ``"cuda"``, ``"ascend"``).
      device_name: a human-readable device family name.
      device_type: the torch device type used to make tensors (``"cuda"``, ``"npu"``).
      dispatch_key: the torch dispatch key for ops registered *by this platform*.
      dist_backend: the ``torch.distributed`` backend (``"nccl"``, ``"gloo"``, ``"hccl"``).
      device_control_env_var: the variable that restricts visible devices, or ``None``.
      supported_dtypes: the floating dtypes this platform's device computes.
      supported_quantization: names of the quantization schemes it runs.
      fp8_dtype: the fp8 dtype of this device, or ``None``.
      fp8_convert_saturates: whether converting float32 to ``fp8_dtype`` on this device (as
        Triton emits it) saturates by itself: finite values and infinities beyond the
        format's range become its largest finite value of that sign, NaN stays NaN, as the
        fp8 quant ops define ``sat``. Kernels then skip their own clamp. ``False`` (the
        default) keeps the clamp; a wrong ``True`` fails the quant ops' saturating and
        non-finite conformance samples.
      plugin_api: ``(min, max)`` plugin-API versions this class was written for,
        ``min <= opcore.PLUGIN_API_VERSION < max``; the core refuses a platform outside it
        (`opcore.platforms.api_version`). Declare it in every platform class you ship.
      conformance_expectations: ``"package:path/to/expectations.toml"``, the conformance
        suite's expectations file for this platform (expected failures, loosened
        tolerances, each with a reason), or ``None``.
    """

    name: ClassVar[str] = ""
    device_name: ClassVar[str] = ""
    device_type: ClassVar[str] = ""
    dispatch_key: ClassVar[str] = "CPU"
    dist_backend: ClassVar[str] = "gloo"
    device_control_env_var: ClassVar[str | None] = None
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32,)
    supported_quantization: ClassVar[tuple[str, ...]] = ()
    fp8_dtype: ClassVar[torch.dtype | None] = None
    fp8_convert_saturates: ClassVar[bool] = False
    plugin_api: ClassVar[tuple[str, str]] = ("2.0", "3.0")
    conformance_expectations: ClassVar[str | None] = None
    # Kernels reach ops only as `opcore.ir` providers, ordered by
    # `get_default_ir_op_priority`; a platform has no say in which layer method runs
    # (plugin API 2.0 removed the per-platform forward chain).

    # ------------------------------------------------------------------ device queries
    # A platform whose device has a torch device module inherits all of these from
    # `opcore.platforms.torch_device.TorchDevicePlatform` instead of writing them.
    @abc.abstractmethod
    def device_count(self) -> int:
        """Number of devices of this platform visible to the process."""

    @abc.abstractmethod
    def get_device_name(self, index: int = 0) -> str:
        """Marketing name of device ``index`` (e.g. ``"NVIDIA H200"``)."""

    def get_device_capability(self, index: int = 0) -> tuple[int, int] | None:
        """Compute capability ``(major, minor)`` of device ``index``; ``None`` if the
        notion does not apply to this device (default)."""
        return None

    @abc.abstractmethod
    def get_device_total_memory(self, index: int = 0) -> int:
        """Total memory of device ``index`` in bytes."""

    def synchronize(self) -> None:
        """Wait for all work queued on the current device. Default: nothing to wait for."""

    def manual_seed_all(self, seed: int) -> None:
        """Seed every device's generator. Default: ``torch.manual_seed``."""
        torch.manual_seed(seed)

    def empty_cache(self) -> None:
        """Release cached device memory to the driver. Default: nothing cached."""

    def timing_event(self) -> Any | None:
        """A new device event with timing enabled, for benchmarks (``opcore bench``): the
        ``torch.Event`` protocol, ``record()``, ``synchronize()`` and
        ``start.elapsed_time(end)`` in milliseconds of device time. Default: ``None``, the
        device has no timing events and callers time the host clock around `synchronize`."""
        return None

    def capture_graph(self, fn: Callable[[], object]) -> Callable[[], object] | None:
        """Capture ``fn``'s device work (run once or more while capturing) into a graph and
        return a callable that replays it, for benchmarks that time device work without
        launch gaps. ``fn``'s tensors must stay alive while the replay is used.
        Default: ``None``, the device has no graphs."""
        return None

    def inference_mode(self) -> contextlib.AbstractContextManager[Any]:
        """The context manager that disables autograd for inference on this device.
        Default: ``torch.inference_mode()``; platforms whose runtime cannot handle
        inference tensors return ``torch.no_grad()``."""
        return torch.inference_mode()

    def tensor_descriptor_copies(self, index: int = 0) -> bool:
        """Whether device ``index`` copies the tiles of Triton's tensor descriptors with
        dedicated hardware (a bulk tile-copy engine), so a kernel that can read a tile
        through a descriptor should (``TRITON_PAGED``'s prefill does where a page holds
        whole key tiles). Default: ``False``, pointer loads."""
        return False

    # ------------------------------------------------------------------ hooks
    def import_kernels(self) -> None:
        """Import the modules that register this platform's torch ops (custom kernels
        the platform's layers call) and register its attention backends
        (`opcore.attention.register_backend`). Called once, lazily, before the first op
        dispatch, layer construction or attention selection. Default: nothing."""

    def import_ir_kernels(self) -> None:
        """Import the modules that register this platform's `opcore.ir` providers.
        Called once, lazily, before the first op dispatch. Default: nothing."""

    def get_default_ir_op_priority(self, config: OpcoreConfig) -> dict[str, list[str]]:
        """This platform's default provider order per op, e.g.
        ``{"rms_norm": ["triton", "native"]}``. Ops not named use ``["native"]``.
        ``config.compilation.mode`` tells eager from inductor. Default: ``{}``."""
        return {}

    def get_attn_backend_candidates(self, cfg: Any) -> list[str]:
        """Attention backend names to try, in order, for selector config ``cfg``. The
        generic selector validates each and takes the first valid one. Names only: each
        must be registered in `opcore.attention.registry` (the core's, or one this plugin
        registers in `import_kernels`), which alone maps a name to its class.
        Default: ``["TORCH_NATIVE"]``."""
        return ["TORCH_NATIVE"]

    def pre_register_and_update(self, parser: argparse.ArgumentParser | None = None) -> None:
        """Called before configuration is built; may add platform options to ``parser``.
        Default: nothing."""

    def apply_config_platform_defaults(self, config: OpcoreConfig) -> None:
        """Set platform defaults on ``config``, before environment and explicit
        arguments override them. Default: nothing."""

    def check_and_update_config(self, config: OpcoreConfig) -> None:
        """Validate and adjust the final ``config``; the platform has the last word.
        Must tolerate any explicit config. Default: nothing."""

    def get_device_communicator_cls(self) -> str | None:
        """Dotted path of this platform's `opcore.distributed.Communicator` subclass (its
        collectives, and whether they are ``capture_safe``), or ``None`` for the default
        `opcore.distributed.TorchCommunicator` on ``dist_backend`` (default). See
        docs/distributed.md."""
        return None

    def device_summary(self) -> dict[str, Any]:
        """Facts about this platform's devices for `opcore info`. Default: count, and per
        device its name, total memory and capability. Platforms may add entries."""
        devices = []
        for i in range(self.device_count()):
            devices.append(
                {
                    "index": i,
                    "name": self.get_device_name(i),
                    "total_memory_bytes": self.get_device_total_memory(i),
                    "capability": self.get_device_capability(i),
                }
            )
        return {"count": len(devices), "devices": devices}

    # ------------------------------------------------------------------ helpers
    def device(self, index: int = 0) -> torch.device:
        """The torch device for device ``index`` of this platform."""
        if self.device_type in ("cpu", "meta"):
            return torch.device(self.device_type)
        return torch.device(self.device_type, index)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device_type={self.device_type!r})"


def declared_members() -> dict[str, str]:
    """Every public member of the interface and its kind: ``"attribute"`` or ``"method"``.

    The conformance suite uses this to flag overrides the core never calls (stale or
    misspelled names) and members whose kind changed.
    """
    out: dict[str, str] = {}
    for klass in Platform.__mro__:
        if klass is object:
            continue
        for key, value in vars(klass).items():
            if key.startswith("_") or key in out:
                continue
            out[key] = "method" if callable(value) and not isinstance(value, type) else "attribute"
    return out


class UnspecifiedPlatform(Platform):
    """The platform used when no plugin is installed at all: native kernels on the CPU
    device through plain torch. Its presence is always warned about."""

    name = "unspecified"
    device_name = "unspecified"
    device_type = "cpu"
    dispatch_key = "CPU"
    dist_backend = "gloo"

    def device_count(self) -> int:
        return 1

    def get_device_name(self, index: int = 0) -> str:
        return "unspecified (host CPU through plain torch)"

    def get_device_total_memory(self, index: int = 0) -> int:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
