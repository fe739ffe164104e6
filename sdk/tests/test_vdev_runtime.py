"""`opcore.vdev`, the virtual accelerator: tensors, kernels, errors, settings.

Each test that installs the device runs in a fresh interpreter (`run_python`): renaming
PrivateUse1 is process-wide and can happen once, so it must not leak into the pytest
process. No hardware is faked: the device is real PrivateUse1 tensors whose storages
point at host memory.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from opcore import vdev
from opcore.testing import run_python


def _run(code: str, env: dict[str, str] | None = None) -> dict:
    proc = run_python(code, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tensors_keep_layout_share_storage_and_round_trip():
    out = _run(
        """
        import json, torch
        from opcore import vdev
        dev = vdev.install()
        host = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        x = host.to("vdev")
        view = x[1:, ::2]                       # offset and strides, no copy
        view.mul_(-1)                           # writes through to x
        t = x.t()
        y = (t * 2 + 1).sum(dim=0)
        base = host.clone(); base[1:, ::2] *= -1
        print(json.dumps({
            "device": str(x.device), "type": type(x).__name__,
            "view": [list(view.stride()), view.storage_offset(),
                     view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()],
            "t_stride": list(t.stride()),
            "values": torch.equal(x.cpu(), base),
            "y_device": str(y.device), "y": torch.equal(y.cpu(), (base.t() * 2 + 1).sum(dim=0)),
            "used": dev.memory.used[0] > 0,
        }))
        """
    )
    assert out["device"] == "vdev:0" and out["type"] == "Tensor"
    assert out["view"] == [[6, 2], 6, True]
    assert out["t_stride"] == [1, 6]
    assert out["values"] and out["y"] and out["y_device"] == "vdev:0" and out["used"]


def test_memory_is_counted_freed_and_limited():
    out = _run(
        """
        import gc, json, torch
        from opcore import vdev
        dev = vdev.install(memory_bytes=4096)
        a = torch.empty(256, dtype=torch.float32, device="vdev")   # 1024 bytes
        used = torch.vdev.memory_allocated()
        try:
            torch.empty(1024, dtype=torch.float32, device="vdev")  # 4096 more: over
            oom = None
        except torch.OutOfMemoryError as exc:
            oom = str(exc)
        del a; gc.collect()
        print(json.dumps({"used": used, "oom": oom, "after": torch.vdev.memory_allocated(),
                          "peak": torch.vdev.max_memory_allocated(),
                          "free_total": list(torch.vdev.mem_get_info())}))
        """
    )
    assert out["used"] == 1024
    assert out["oom"] is not None and "vdev:0 out of memory" in out["oom"] and "4096" in out["oom"]
    assert out["after"] == 0 and out["peak"] == 1024
    assert out["free_total"] == [4096, 4096]


def test_a_collection_inside_an_allocation_frees_without_deadlock():
    """Issue 27 item 1. Cyclic garbage holding vdev tensors, collected by a garbage
    collection that starts inside the allocator's locked code: the freed storages' weakref
    callbacks run there, in the same thread. They used to take the allocator's lock and
    wait on it forever; now the frees are queued and counted by the next locked operation.
    Collection points move with the code, so the loop sweeps gc thresholds (one of them
    deadlocked the old code within a second); a fresh interpreter and a time bound, so a
    deadlock is a failure naming itself, not a hung run."""
    code = """
        import gc, json, torch
        from opcore import vdev
        dev = vdev.install(memory_bytes=1 << 20)

        class Holder:  # a reference cycle: only the collector frees it
            pass

        for threshold in range(2, 80):
            gc.set_threshold(threshold, 10**6, 10**6)  # young collections only, often
            for _ in range(40):
                h = Holder(); h.me = h; h.t = torch.empty(16, device="vdev")
                del h
                keep = torch.empty(8, device="vdev") + 1
        gc.set_threshold(700, 10, 10)
        del keep
        gc.collect()
        after = torch.vdev.memory_allocated()
        # A free seen only by a collection is counted before the next capacity check:
        # the whole device, dropped as garbage, is allocatable again at once.
        h = Holder(); h.me = h; h.t = torch.empty(1 << 18, device="vdev")  # all 1 MiB
        del h
        gc.collect()
        again = torch.empty(1 << 18, device="vdev")
        print(json.dumps({"after": after, "again": torch.vdev.memory_allocated(),
                          "peak": torch.vdev.max_memory_allocated()}))
    """
    try:
        proc = run_python(code, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the virtual device deadlocked: no result within 60 s of cyclic garbage")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"after": 0, "again": 1 << 20, "peak": 1 << 20}


def test_unsupported_op_and_dtype_raise_one_line_naming_them():
    out = _run(
        """
        import json, torch
        from opcore import vdev
        vdev.install(dtypes=(torch.float32,))
        errors = {}
        for name, fn in {
            "op": lambda: torch.linalg.inv(torch.eye(2, device="vdev")),
            "f64": lambda: torch.ones(2, dtype=torch.float64).to("vdev"),
            "bf16": lambda: torch.ones(2, device="vdev").to(torch.bfloat16),
        }.items():
            try:
                fn()
                errors[name] = None
            except Exception as exc:
                errors[name] = [type(exc).__name__, str(exc)]
        print(json.dumps(errors))
        """
    )
    kind, msg = out["op"]
    assert kind == "UnsupportedOpError" and "\n" not in msg
    assert (
        msg.startswith("aten::linalg_inv_ex")
        and "not supported by the virtual device 'vdev'" in msg
    )
    for key, dtype in (("f64", "float64"), ("bf16", "bfloat16")):
        kind, msg = out[key]
        assert (
            kind == "TypeError"
            and f"does not support {dtype}" in msg
            and "its dtypes: float32" in msg
        )


def test_devices_are_separate_and_results_stay_on_their_device():
    out = _run(
        """
        import json, torch
        from opcore import vdev
        vdev.install(devices=2)
        a = torch.ones(3, device="vdev:1")
        b = (a + a).exp()
        with torch.vdev.device(1):
            c = torch.zeros(2, device="vdev")
        try:
            a + torch.ones(3, device="vdev:0")
            mixed = None
        except RuntimeError as exc:
            mixed = str(exc)
        try:
            torch.ones(1, device="vdev:2")
            missing = None
        except RuntimeError as exc:
            missing = str(exc)
        print(json.dumps({"count": torch.vdev.device_count(), "b": str(b.device),
                          "c": str(c.device), "current": torch.vdev.current_device(),
                          "to0": str(b.to("vdev:0").device), "mixed": mixed, "missing": missing}))
        """
    )
    assert out["count"] == 2 and out["b"] == "vdev:1" and out["c"] == "vdev:1"
    assert out["current"] == 0 and out["to0"] == "vdev:0"
    assert "vdev:1" in out["mixed"] and "vdev:0" in out["mixed"]
    assert "vdev:2 does not exist" in out["missing"] and "2 device(s)" in out["missing"]


def test_second_install_under_another_name_names_both():
    out = _run(
        """
        import json, torch
        from opcore import vdev
        first = vdev.install("nimbus")
        again = vdev.install("nimbus") is first          # equal settings: the same device
        errors = []
        for kwargs in ({"device_type": "vdev"}, {"device_type": "nimbus", "devices": 2}):
            try:
                vdev.install(**kwargs)
            except vdev.VirtualDeviceError as exc:
                errors.append(str(exc))
        name = torch._C._get_privateuse1_backend_name()
        print(json.dumps({"again": again, "errors": errors, "name": name}))
        """
    )
    assert out["again"] and out["name"] == "nimbus"
    assert len(out["errors"]) == 2
    assert "'vdev'" in out["errors"][0] and "'nimbus'" in out["errors"][0]
    assert "renamed only once" in out["errors"][0]
    assert "devices=2" in out["errors"][1] and "devices=1" in out["errors"][1]


def test_install_refuses_a_privateuse1_taken_by_another_backend():
    out = _run(
        """
        import json, torch
        torch.utils.rename_privateuse1_backend("otherdev")
        from opcore import vdev
        try:
            vdev.install()
            print(json.dumps(None))
        except vdev.VirtualDeviceError as exc:
            print(json.dumps(str(exc)))
        """
    )
    assert "'otherdev'" in out and "'vdev'" in out


def test_settings_from_env_reads_and_rejects():
    assert vdev.settings_from_env({}) == {}
    got = vdev.settings_from_env(
        {vdev.ENV_DEVICES: "3", vdev.ENV_DTYPES: "float32, bfloat16", vdev.ENV_MEMORY: "2G"}
    )
    import torch

    assert got == {"devices": 3, "dtypes": (torch.float32, torch.bfloat16), "memory_bytes": 2 << 30}
    for env, needle in (
        ({vdev.ENV_DEVICES: "0"}, vdev.ENV_DEVICES),
        ({vdev.ENV_DEVICES: "two"}, vdev.ENV_DEVICES),
        ({vdev.ENV_DTYPES: "float32,int8"}, "'int8'"),
        ({vdev.ENV_MEMORY: "lots"}, vdev.ENV_MEMORY),
    ):
        with pytest.raises(ValueError, match=needle):
            vdev.settings_from_env(env)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"device_type": "Bad-Name"}, "lowercase identifier"),
        ({"devices": 0}, "devices=0"),
        ({"dtypes": (object(),)}, "not a torch floating dtype"),
        ({"memory_bytes": -1}, "memory_bytes=-1"),
    ],
)
def test_install_rejects_bad_settings_before_touching_torch(kwargs, needle):
    # Validation runs first, so this is safe in the pytest process: nothing is renamed.
    with pytest.raises(vdev.VirtualDeviceError, match=needle):
        vdev.install(**kwargs)
    assert vdev.installed() is None


def test_resize_out_set_and_cross_device_copies():
    out = _run(
        """
        import json, torch
        from opcore import vdev
        vdev.install(devices=2)
        a, b = torch.arange(6.0).to("vdev"), torch.ones(6).to("vdev")
        grown = torch.arange(3.0).to("vdev")
        grown.resize_(2, 4)                                  # new memory, old values kept
        out = torch.empty(0, device="vdev")
        res = torch.add(a, b, out=out)                       # out= resized by the kernel
        t = torch.empty(0, device="vdev")
        t.set_(a)                                            # shares a's storage
        t.mul_(10)
        on1 = a.to("vdev:1")
        back = torch.zeros(6, device="vdev:0").copy_(on1)   # device to device
        print(json.dumps({
            "grown": [list(grown.shape), grown.reshape(-1)[:3].cpu().tolist()],
            "out": [res is out, list(out.shape), out.cpu().tolist()],
            "set": [t.untyped_storage().data_ptr() == a.untyped_storage().data_ptr(),
                    a.cpu().tolist()],
            "copy": [str(on1.device), str(back.device), back.cpu().tolist()],
        }))
        """
    )
    assert out["grown"] == [[2, 4], [0.0, 1.0, 2.0]]
    assert out["out"] == [True, [6], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]
    assert out["set"] == [True, [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]]
    assert out["copy"] == ["vdev:1", "vdev:0", [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]]
