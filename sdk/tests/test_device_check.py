"""`opcore.platforms.device_check`: a platform whose device type torch does not know is
named in one line with what to install or switch on."""

from __future__ import annotations

import json
import types

from opcore.platforms.device_check import device_type_problem, standin_env
from opcore.testing import run_python


def _platform(name: str, device_type: str):
    return types.SimpleNamespace(name=name, device_type=device_type)


def test_known_device_types_have_no_problem():
    assert device_type_problem(_platform("cpu", "cpu")) is None
    assert (
        device_type_problem(_platform("cuda", "cuda")) is None
    )  # known to torch, even without a GPU


def test_an_unknown_device_type_is_one_line_naming_plugin_and_remedies():
    msg = device_type_problem(_platform("nimbus", "nimbus"), "opcore-plugin-nimbus")
    assert msg is not None and "\n" not in msg
    assert "platform 'nimbus' (opcore-plugin-nimbus)" in msg and "device type 'nimbus'" in msg
    assert "torch does not know it" in msg
    assert standin_env("nimbus") == "OPCORE_NIMBUS_STANDIN"
    assert "torch extension" in msg and "OPCORE_NIMBUS_STANDIN=1" in msg


def test_a_renamed_privateuse1_needs_its_device_module():
    code = """
    import json, types, torch
    from opcore.platforms.device_check import device_type_problem
    p = types.SimpleNamespace(name="nimbus", device_type="nimbus")
    torch.utils.rename_privateuse1_backend("nimbus")
    before = device_type_problem(p)
    torch._register_device_module("nimbus", types.ModuleType("nimbus_module"))
    print(json.dumps([before, device_type_problem(p)]))
    """
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = json.loads(proc.stdout.splitlines()[-1])
    assert "has no device module torch.nimbus" in before
    assert after is None
