"""`TorchDevicePlatform`: device queries answered by ``torch.get_device_module(device_type)``.

The default path runs against torch's real ``torch.cpu`` module (it has ``device_count``
and ``synchronize`` but no name, property, seed or cache queries), against a device type
torch has no module for, and, in a fresh interpreter, against `opcore.vdev`: a Python
backend registered with torch like an accelerator's (PrivateUse1 renamed, a device module
found by ``torch.get_device_module``). Shapes of answers no real module gives here are
checked by handing the base a stand-in module through its `device_module` hook; those
tests say so in their names.
"""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch

from opcore.platforms.torch_device import DeviceQueryError, TorchDevicePlatform
from opcore.testing import run_python


class HostPlatform(TorchDevicePlatform):
    name = "host_probe"
    device_name = "host_probe"
    device_type = "cpu"


class XlaTypedPlatform(TorchDevicePlatform):
    name = "xla_probe"
    device_name = "xla_probe"
    device_type = "xla"  # a torch device type whose module torch does not register itself


class StandInModule(types.SimpleNamespace):
    """A device module for hardware absent here: records the calls the base makes."""

    def __init__(self, **answers):
        super().__init__(calls=[], __name__="torch.standin")
        self.answers = answers

    def _answer(self, name, *args):
        self.calls.append((name, *args))
        answer = self.answers[name]
        if isinstance(answer, Exception):
            raise answer
        return answer(*args) if callable(answer) else answer

    def device_count(self):
        return self._answer("device_count")

    def get_device_name(self, index):
        return self._answer("get_device_name", index)

    def get_device_capability(self, index):
        return self._answer("get_device_capability", index)

    def get_device_properties(self, index):
        return self._answer("get_device_properties", index)

    def synchronize(self):
        return self._answer("synchronize")

    def manual_seed_all(self, seed):
        return self._answer("manual_seed_all", seed)

    def empty_cache(self):
        return self._answer("empty_cache")


GOOD_ANSWERS = {
    "device_count": 2,
    "get_device_name": lambda i: f"stand-in accelerator {i}",
    "get_device_capability": lambda i: (9, i),
    "get_device_properties": lambda i: types.SimpleNamespace(total_memory=(i + 1) << 30),
    "synchronize": None,
    "manual_seed_all": None,
    "empty_cache": None,
}


def stand_in_platform(**overrides):
    module = StandInModule(**{**GOOD_ANSWERS, **overrides})

    class StandInPlatform(TorchDevicePlatform):
        name = "standin"
        device_name = "standin"
        device_type = "cpu"

        def device_module(self):
            return module

    return StandInPlatform(), module


def test_the_device_module_is_torchs_module_for_the_device_type():
    assert HostPlatform().device_module() is torch.cpu


def test_queries_the_real_cpu_module_has_are_answered_by_it():
    p = HostPlatform()
    assert p.device_count() == torch.cpu.device_count() == 1
    p.synchronize()  # torch.cpu.synchronize exists and returns


@pytest.mark.parametrize(
    "query, call, function",
    [
        ("get_device_name", lambda p: p.get_device_name(0), "get_device_name"),
        ("get_device_capability", lambda p: p.get_device_capability(0), "get_device_capability"),
        (
            "get_device_total_memory",
            lambda p: p.get_device_total_memory(0),
            "get_device_properties",
        ),
        ("manual_seed_all", lambda p: p.manual_seed_all(0), "manual_seed_all"),
        ("empty_cache", lambda p: p.empty_cache(), "empty_cache"),
    ],
)
def test_a_query_the_real_cpu_module_lacks_raises_naming_platform_query_and_function(
    query, call, function
):
    with pytest.raises(DeviceQueryError) as info:
        call(HostPlatform())
    message = str(info.value)
    assert "\n" not in message
    assert "platform 'host_probe'" in message
    assert f"{query}() needs torch.cpu.{function}()" in message
    assert f"override HostPlatform.{query}" in message


def test_manual_seed_all_leaves_the_host_seed_alone_when_the_device_cannot_be_seeded():
    torch.manual_seed(123)
    with pytest.raises(DeviceQueryError):
        HostPlatform().manual_seed_all(7)
    assert torch.initial_seed() == 123  # refused before seeding anything


def test_a_device_type_without_a_torch_module_raises_naming_the_platform():
    with pytest.raises(DeviceQueryError) as info:
        XlaTypedPlatform().device_count()
    message = str(info.value)
    assert "\n" not in message
    assert "platform 'xla_probe'" in message
    assert "no device module for device type 'xla'" in message
    assert "XlaTypedPlatform.device_module()" in message


def test_a_device_type_torch_does_not_know_raises_one_line_with_the_remedy():
    class GhostPlatform(TorchDevicePlatform):
        name = "ghostq"
        device_name = "ghostq"
        device_type = "ghostq"  # nothing renames PrivateUse1 to it in this process

    with pytest.raises(DeviceQueryError) as info:
        GhostPlatform().get_device_name(0)
    message = str(info.value)
    assert "\n" not in message
    assert "platform 'ghostq'" in message and "device type 'ghostq'" in message
    assert "torch extension" in message and "GhostPlatform.device_module()" in message
    assert "Expected one of" not in message  # not torch's list of every device type


def test_every_query_routes_to_a_stand_in_device_module():
    p, module = stand_in_platform()
    assert p.device_count() == 2
    assert p.get_device_name(1) == "stand-in accelerator 1"
    assert p.get_device_capability(1) == (9, 1)
    assert p.get_device_total_memory(1) == 2 << 30
    p.synchronize()
    p.manual_seed_all(31)
    p.empty_cache()
    assert module.calls == [
        ("device_count",),
        ("get_device_name", 1),
        ("get_device_capability", 1),
        ("get_device_properties", 1),
        ("synchronize",),
        ("manual_seed_all", 31),
        ("empty_cache",),
    ]
    assert torch.initial_seed() == 31  # the host generator is seeded too
    summary = p.device_summary()  # the interface's default, built on the queries
    assert summary["count"] == 2
    assert summary["devices"][0] == {
        "index": 0,
        "name": "stand-in accelerator 0",
        "total_memory_bytes": 1 << 30,
        "capability": (9, 0),
    }


def test_integer_answers_of_other_integer_types_become_plain_ints_with_a_stand_in_module():
    p, _ = stand_in_platform(
        device_count=np.int64(3),
        get_device_capability=lambda i: (np.int32(8), np.int32(9)),
        get_device_properties=lambda i: types.SimpleNamespace(total_memory=np.int64(1 << 34)),
    )
    assert p.device_count() == 3 and type(p.device_count()) is int
    cap = p.get_device_capability(0)
    assert cap == (8, 9) and all(type(v) is int for v in cap)
    assert p.get_device_total_memory(0) == 1 << 34
    assert type(p.get_device_total_memory(0)) is int


@pytest.mark.parametrize(
    "answers, call, expected",
    [
        ({"device_count": True}, lambda p: p.device_count(), "expected an int >= 0"),
        ({"device_count": -1}, lambda p: p.device_count(), "expected an int >= 0"),
        ({"get_device_name": lambda i: None}, lambda p: p.get_device_name(0), "expected a str"),
        (
            {"get_device_capability": lambda i: {"fp64": True}},
            lambda p: p.get_device_capability(0),
            "got {'fp64': True} from get_device_capability(), expected (major, minor) ints",
        ),
        (
            {"get_device_capability": lambda i: (9, 0, 1)},
            lambda p: p.get_device_capability(0),
            "expected (major, minor) ints",
        ),
        (
            {"get_device_properties": lambda i: types.SimpleNamespace(total_memory=None)},
            lambda p: p.get_device_total_memory(0),
            "got None from get_device_properties().total_memory, expected an int > 0 (bytes)",
        ),
        (
            {"get_device_properties": lambda i: types.SimpleNamespace()},
            lambda p: p.get_device_total_memory(0),
            "expected an int > 0 (bytes)",
        ),
    ],
)
def test_an_answer_of_the_wrong_shape_is_refused_not_guessed_with_a_stand_in_module(
    answers, call, expected
):
    p, _ = stand_in_platform(**answers)
    with pytest.raises(DeviceQueryError) as info:
        call(p)
    message = str(info.value)
    assert expected in message
    assert "platform 'standin'" in message and "override StandInPlatform." in message


def test_the_devices_own_errors_pass_through_unchanged_with_a_stand_in_module():
    lost = RuntimeError("device 1 lost")
    p, _ = stand_in_platform(get_device_name=lost, synchronize=lost)
    for call in (lambda: p.get_device_name(1), p.synchronize):
        with pytest.raises(RuntimeError) as info:
            call()
        assert info.value is lost


def test_a_query_the_platform_overrides_wins_over_the_module():
    class NoCapability(HostPlatform):
        def get_device_capability(self, index: int = 0) -> tuple[int, int] | None:
            return None

    assert NoCapability().get_device_capability(0) is None


_VDEV_SCRIPT = """
import json
import torch
from opcore import vdev
from opcore.platforms.torch_device import TorchDevicePlatform

class TdqPlatform(TorchDevicePlatform):
    name = "tdq"
    device_name = "tdq"
    device_type = "tdq"

vdev.install("tdq", devices=2, memory_bytes=3 << 30, name="tdq accelerator")
p = TdqPlatform()
torch.manual_seed(1)
p.manual_seed_all(11)
p.synchronize()
p.empty_cache()
print(json.dumps({
    "module": p.device_module() is torch.get_device_module("tdq"),
    "count": p.device_count(),
    "name": p.get_device_name(1),
    "memory": p.get_device_total_memory(1),
    "capability": p.get_device_capability(0),
    "seed": torch.initial_seed(),
    "summary": p.device_summary(),
    "torch_has_graph_class": getattr(torch.accelerator, "Graph", None) is not None,
    "graph_class": repr(p.graph_class()),
    "capture": repr(p.capture_graph(lambda: None)),
}))
"""


def test_every_query_answers_from_a_python_backends_registered_device_module():
    proc = run_python(_VDEV_SCRIPT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["module"] is True
    assert got["count"] == 2
    assert got["name"] == "tdq accelerator"
    assert got["memory"] == 3 << 30
    assert got["capability"] == [0, 0]
    assert got["seed"] == 11
    assert got["summary"]["count"] == 2
    assert [d["index"] for d in got["summary"]["devices"]] == [0, 1]
    # torch has a graph class for every accelerator, but this device's runtime has no
    # graphs: the platform says so (None) instead of handing out a class that refuses.
    assert got["torch_has_graph_class"] is True
    assert got["graph_class"] == "None" and got["capture"] == "None"
