"""`VirtualDevice`: one installed virtual accelerator, and its ``torch.<device_type>`` module."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

from opcore.vdev._memory import Memory


@dataclasses.dataclass(frozen=True)
class VirtualDeviceConfig:
    """What the virtual device looks like (compared when it is installed twice)."""

    device_type: str
    devices: int
    dtypes: tuple[torch.dtype, ...]
    memory_bytes: int | None
    name: str


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.<device_type>.get_device_properties(i)`` answers."""

    name: str
    total_memory: int  # bytes: the configured memory size, or the host's memory when unbounded
    index: int


def host_memory_bytes() -> int:
    """The host's physical memory: what bounds an unbounded virtual device."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class VirtualDevice:
    """The state of the installed virtual device: its configuration, its memory, the
    current device index. `DeviceModule` exposes it as ``torch.<device_type>``."""

    def __init__(self, config: VirtualDeviceConfig) -> None:
        self.config = config
        self.device_type = config.device_type
        self.memory = Memory(config.device_type, config.devices, config.memory_bytes)
        self.current_index = 0
        # aten overload -> times the device ran it: what ran on the device, for tests and
        # for a vendor checking that a kernel really computes there
        self.op_counts: dict[str, int] = {}

    def check_dtype(self, dtype: torch.dtype, op: str) -> None:
        """Raise for a floating or complex dtype this device does not compute."""
        if (dtype.is_floating_point or dtype.is_complex) and dtype not in self.config.dtypes:
            have = ", ".join(str(d).replace("torch.", "") for d in self.config.dtypes)
            raise TypeError(
                f"{op}: the virtual device {self.device_type!r} does not support "
                f"{str(dtype).replace('torch.', '')} (its dtypes: {have})"
            )

    def check_index(self, index: int, op: str) -> None:
        if not 0 <= index < self.config.devices:
            raise RuntimeError(
                f"{op}: {self.device_type}:{index} does not exist: the virtual device has "
                f"{self.config.devices} device(s) ({self.device_type}:0 to "
                f"{self.device_type}:{self.config.devices - 1})"
            )


class DeviceModule:
    """``torch.<device_type>``: the device queries torch and opcore ask a backend."""

    def __init__(self, device: VirtualDevice) -> None:
        self._device = device

    # what torch's PrivateUse1 plumbing calls
    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:
        return False

    def _lazy_init(self) -> None:
        """Nothing to initialise: the device exists once installed."""

    def device_count(self) -> int:
        return self._device.config.devices

    def current_device(self) -> int:
        return self._device.current_index

    def set_device(self, device: int | str | torch.device) -> None:
        index = self._index(device)
        self._device.check_index(index, "set_device")
        self._device.current_index = index

    @contextlib.contextmanager
    def device(self, device: int | str | torch.device) -> Iterator[None]:
        """Make ``device`` the current device inside the block."""
        before = self._device.current_index
        self.set_device(device)
        try:
            yield
        finally:
            self._device.current_index = before

    def synchronize(self, device: int | str | torch.device | None = None) -> None:
        """Nothing is queued: every kernel has finished when it returns."""

    # Random numbers: the device draws from the host's default generator (its kernels
    # are the CPU's), so its generator state is that one's. torch.manual_seed calls
    # manual_seed_all here itself: these must not call back into it.
    def manual_seed(self, seed: int) -> None:
        torch.default_generator.manual_seed(int(seed))

    def manual_seed_all(self, seed: int) -> None:
        torch.default_generator.manual_seed(int(seed))

    def seed_all(self) -> None:
        torch.default_generator.seed()

    def initial_seed(self) -> int:
        return torch.default_generator.initial_seed()

    def get_rng_state(self, device: int | str | torch.device | None = None) -> torch.Tensor:
        return torch.default_generator.get_state()

    def set_rng_state(
        self, new_state: torch.Tensor, device: int | str | torch.device | None = None
    ) -> None:
        torch.default_generator.set_state(new_state)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state(i) for i in range(self.device_count())]

    def set_rng_state_all(self, new_states) -> None:
        for state in new_states:
            self.set_rng_state(state)

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [d for d in self._device.config.dtypes if d != torch.float32]

    def get_device_name(self, device: int | str | torch.device | None = None) -> str:
        return self.get_device_properties(device).name

    def get_device_properties(
        self, device: int | str | torch.device | None = None
    ) -> DeviceProperties:
        index = self._index(device)
        self._device.check_index(index, "get_device_properties")
        total = self._device.config.memory_bytes
        return DeviceProperties(
            self._device.config.name, host_memory_bytes() if total is None else total, index
        )

    def get_device_capability(
        self, device: int | str | torch.device | None = None
    ) -> tuple[int, int]:
        return (0, 0)

    # memory statistics, under the names torch's device modules use
    def memory_allocated(self, device: int | str | torch.device | None = None) -> int:
        return self._device.memory.used[self._index(device)]

    def max_memory_allocated(self, device: int | str | torch.device | None = None) -> int:
        return self._device.memory.peak[self._index(device)]

    def reset_peak_memory_stats(self, device: int | str | torch.device | None = None) -> None:
        self._device.memory.reset_peak(self._index(device))

    def mem_get_info(self, device: int | str | torch.device | None = None) -> tuple[int, int]:
        index = self._index(device)
        total = self.get_device_properties(index).total_memory
        return total - self._device.memory.used[index], total

    def empty_cache(self) -> None:
        """Nothing cached: freed device memory goes back at once."""

    def _index(self, device: int | str | torch.device | None) -> int:
        if device is None:
            return self._device.current_index
        if isinstance(device, int):
            return device
        device = torch.device(device)
        if device.type != self._device.device_type:
            raise ValueError(f"expected a {self._device.device_type} device, got {device}")
        return self._device.current_index if device.index is None else device.index


class PrivateUse1Hooks(torch._C._acc.PrivateUse1Hooks):
    """What torch's C++ side asks the PrivateUse1 backend."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class DeviceGuard(torch._C._acc.DeviceGuard):
    """torch's device guard for PrivateUse1 from Python. torch's Python guard answers
    device index 0 and one device to C++ whatever this says; the virtual device keeps its
    own current index (`DeviceModule.set_device`) and places results by their inputs'."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1
