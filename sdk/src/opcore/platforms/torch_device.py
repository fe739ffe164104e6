"""`TorchDevicePlatform`: an opt-in `Platform` base whose device queries torch answers.

Most accelerators that torch knows expose a device module, ``torch.<device_type>``, with
the same query functions (``device_count``, ``get_device_name``, ``get_device_properties``,
``synchronize``, ...). A platform whose device has such a module subclasses
`TorchDevicePlatform` instead of `Platform` and writes no device query at all; it overrides
only the queries its device answers differently.

The module is found with ``torch.get_device_module(device_type)``, keyed by the platform's
own device type. ``torch.accelerator`` is not used: it answers for the one accelerator the
torch build was made for, which need not be this platform's device, and in torch 2.8 it has
no name, property or memory queries.

Nothing falls back in silence: a query whose function the device module lacks, or whose
answer has the wrong shape, raises `DeviceQueryError` naming the platform, the query and the
function, and saying which method to override.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from opcore.platforms.device_check import device_type_problem
from opcore.platforms.interface import Platform


class DeviceQueryError(RuntimeError):
    """A `TorchDevicePlatform` query that the platform's torch device module cannot answer."""


def _as_int(value: Any) -> int | None:
    """``value`` as a plain int when it is an integer (numpy and 0-d tensor integers
    included; bools excluded), else ``None``."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


class TorchDevicePlatform(Platform):
    """A `Platform` whose device queries are answered by ``torch.<device_type>``.

    Answered here: `device_count`, `get_device_name`, `get_device_capability`,
    `get_device_total_memory`, `synchronize`, `manual_seed_all`, `empty_cache` and
    `timing_event`. Each calls the device module's function of the same purpose; the
    device's own errors pass through unchanged. `capture_graph` uses
    ``torch.accelerator.Graph`` when torch has it for this device type.

    Override `device_module` when the module appears only once a runtime is imported
    (``import <runtime>`` then ``return super().device_module()``); override a query when
    the device answers it differently (e.g. a capability that is not ``(major, minor)``).
    """

    def device_module(self) -> ModuleType:
        """The torch device module of ``device_type`` (``torch.get_device_module``).

        Raises:
            DeviceQueryError: torch does not know the device type in this process (its
                runtime is not installed or not imported), or has no module for it; one
                line naming the platform and the remedy.
        """
        problem = device_type_problem(self)
        if problem is not None:  # torch's own error here is a list of every device type
            raise DeviceQueryError(
                f"{problem} (a runtime the plugin installs but imports later belongs in "
                f"{type(self).__name__}.device_module(), before super().device_module())"
            )
        try:
            return torch.get_device_module(self.device_type)
        except Exception as exc:  # torch raises RuntimeError; any failure means "no module"
            raise DeviceQueryError(
                f"platform {self.name!r}: torch has no device module for device type "
                f"{self.device_type!r} ({exc}); override {type(self).__name__}.device_module() "
                f"or the queries"
            ) from exc

    def _device_function(self, query: str, function: str) -> Any:
        """The device module's ``function``, or a `DeviceQueryError` naming ``query``."""
        module = self.device_module()
        fn = getattr(module, function, None)
        if not callable(fn):
            where = getattr(module, "__name__", f"torch.{self.device_type}")
            raise DeviceQueryError(
                f"platform {self.name!r}: {query}() needs {where}.{function}(), "
                f"which this torch does not have; override {type(self).__name__}.{query}"
            )
        return fn

    def _wrong_answer(self, query: str, source: str, value: Any, expected: str) -> DeviceQueryError:
        return DeviceQueryError(
            f"platform {self.name!r}: {query}() got {value!r} from {source}, expected "
            f"{expected}; override {type(self).__name__}.{query}"
        )

    # ------------------------------------------------------------------ device queries
    def device_count(self) -> int:
        """``torch.<device_type>.device_count()``."""
        value = self._device_function("device_count", "device_count")()
        count = _as_int(value)
        if count is None or count < 0:
            raise self._wrong_answer("device_count", "device_count()", value, "an int >= 0")
        return count

    def get_device_name(self, index: int = 0) -> str:
        """``torch.<device_type>.get_device_name(index)``."""
        value = self._device_function("get_device_name", "get_device_name")(index)
        if not isinstance(value, str):
            raise self._wrong_answer("get_device_name", "get_device_name()", value, "a str")
        return value

    def get_device_capability(self, index: int = 0) -> tuple[int, int] | None:
        """``torch.<device_type>.get_device_capability(index)`` as ``(major, minor)``.

        A device module whose capability is something else (a dict of features, say) is
        refused rather than guessed at: such a platform overrides this query."""
        value = self._device_function("get_device_capability", "get_device_capability")(index)
        if isinstance(value, tuple) and len(value) == 2:
            major, minor = _as_int(value[0]), _as_int(value[1])
            if major is not None and minor is not None:
                return (major, minor)
        raise self._wrong_answer(
            "get_device_capability", "get_device_capability()", value, "(major, minor) ints"
        )

    def get_device_total_memory(self, index: int = 0) -> int:
        """``torch.<device_type>.get_device_properties(index).total_memory`` in bytes."""
        props = self._device_function("get_device_total_memory", "get_device_properties")(index)
        value = getattr(props, "total_memory", None)
        total = _as_int(value)
        if total is None or total <= 0:
            raise self._wrong_answer(
                "get_device_total_memory",
                "get_device_properties().total_memory",
                value,
                "an int > 0 (bytes)",
            )
        return total

    def synchronize(self) -> None:
        """``torch.<device_type>.synchronize()``: wait for the current device's work."""
        self._device_function("synchronize", "synchronize")()

    def manual_seed_all(self, seed: int) -> None:
        """``torch.manual_seed(seed)``, then ``torch.<device_type>.manual_seed_all(seed)``
        (the host generator and every device's, whatever torch.manual_seed covers)."""
        seed_devices = self._device_function("manual_seed_all", "manual_seed_all")
        torch.manual_seed(seed)
        seed_devices(seed)

    def empty_cache(self) -> None:
        """``torch.<device_type>.empty_cache()``: release the allocator's cached memory."""
        self._device_function("empty_cache", "empty_cache")()

    def timing_event(self) -> Any:
        """``torch.<device_type>.Event(enable_timing=True)``."""
        return self._device_function("timing_event", "Event")(enable_timing=True)

    def graph_class(self) -> Any:
        """The class that captures and replays work on this device (``capture_begin``,
        ``capture_end``, ``replay``): ``torch.accelerator.Graph`` where this torch has it and
        its accelerator is this platform's device type and its runtime has graphs, else
        ``None`` (no graphs). A plugin whose torch predates that class but has a
        device-specific one of the same shape returns it here; `capture_graph` needs
        nothing else."""
        graph_cls = getattr(torch.accelerator, "Graph", None)
        accelerator = torch.accelerator.current_accelerator()
        if graph_cls is None or accelerator is None or accelerator.type != self.device_type:
            return None
        return graph_cls if _constructs(graph_cls, self.device_type) else None

    def capture_graph(self, fn: Callable[[], object]) -> Callable[[], object] | None:
        """``fn`` captured with `graph_class` on a side stream (after three warm-up calls
        there), returned as the graph's ``replay``.

        ``None`` when `graph_class` is ``None``. The device's own capture errors pass
        through."""
        graph_cls = self.graph_class()
        if graph_cls is None:
            return None
        # The current device, not device 0: each rank of a multi-device run captures on
        # the device it made current.
        device = self.device(torch.accelerator.current_device_index())
        caller = torch.accelerator.current_stream(device)
        # Capture needs a stream of its own: the default stream cannot be captured.
        side = torch.Stream(device=device)
        side.wait_stream(caller)
        torch.accelerator.set_stream(side)
        try:
            for _ in range(3):  # lazy initialisation (kernels, workspaces) before capture
                fn()
            graph = graph_cls()
            graph.capture_begin()
            try:
                fn()
            finally:
                graph.capture_end()
        finally:
            torch.accelerator.set_stream(caller)
        caller.wait_stream(side)
        return graph.replay


_GRAPHS: dict[tuple[Any, str], bool] = {}


def _constructs(graph_cls: Any, device_type: str) -> bool:
    """Whether ``graph_cls()`` can be made on this device type: torch has the class for
    every accelerator, but a device whose runtime registers no graph support refuses it
    ("Graph is not supported on device type ..."). Asked once per class and device type;
    making a graph object captures nothing."""
    key = (graph_cls, device_type)
    if key not in _GRAPHS:
        try:
            graph_cls()
        except RuntimeError:
            _GRAPHS[key] = False
        else:
            _GRAPHS[key] = True
    return _GRAPHS[key]
