"""opcore-plugin-vdev: its probe, its platform on the virtual device, the ``vdev``
provider and attention backend, and the PrivateUse1 path of ``torch.ops.opcore_ir``.

Everything that switches the device on runs in a fresh interpreter (`run_python`):
PrivateUse1 is renamed once per process and must not leak into the pytest process.
"""

from __future__ import annotations

import json

import opcore_plugin_vdev
import pytest

from opcore.platforms import Absent
from opcore.testing import run_python


def _run(code: str, env: dict[str, str]) -> dict:
    proc = run_python(code, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_probe_is_off_by_default_and_says_how_to_enable(monkeypatch):
    monkeypatch.delenv("OPCORE_VDEV", raising=False)
    result = opcore_plugin_vdev.probe()
    assert isinstance(result, Absent) and not result
    assert "OPCORE_VDEV=1" in result.reason and "OPCORE_VDEV_DEVICES" in result.reason
    monkeypatch.setenv("OPCORE_VDEV", "0")
    assert isinstance(opcore_plugin_vdev.probe(), Absent)


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"OPCORE_VDEV": "yes"}, "OPCORE_VDEV='yes'"),
        ({"OPCORE_VDEV": "1", "OPCORE_VDEV_DEVICES": "x"}, "OPCORE_VDEV_DEVICES"),
    ],
)
def test_probe_reports_a_typo_instead_of_ignoring_it(monkeypatch, env, needle):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=needle):
        opcore_plugin_vdev.probe()


def test_installed_but_off_it_stays_out_of_the_way():
    out = _run(
        """
        import json, torch
        from opcore.platforms import current_platform, explain
        vdev = next(c for c in explain().candidates if c.name == "vdev")
        reason = vdev.reason if hasattr(vdev, "reason") else str(vdev)
        print(json.dumps({"platform": current_platform.name, "vdev": reason,
                          "pu1": torch._C._get_privateuse1_backend_name()}))
        """,
        env={},
    )
    assert out["platform"] == "cpu"
    assert out["pu1"] == "privateuseone"  # nothing renamed, nothing registered
    assert "OPCORE_VDEV=1" in out["vdev"]


def test_platform_provider_and_attention_on_two_devices():
    out = _run(
        """
        import json, torch
        from opcore import vdev
        from opcore.ir import ops
        from opcore.platforms import current_platform as p
        from opcore.attention import selector
        counts = vdev.installed().op_counts
        rsqrt = lambda: sum(n for k, n in counts.items() if k.startswith("aten::rsqrt"))
        results = {"name": p.name, "count": p.device_count(), "dev1": str(p.device(1)),
                   "dtypes": [str(d) for d in p.supported_dtypes]}
        for index in (0, 1):
            x = torch.randn(4, 64).to(p.device(index)); w = torch.randn(64).to(p.device(index))
            before = rsqrt()
            choice = ops.rms_norm.dispatch(x, w, 1e-6)
            y = ops.rms_norm(x, w, 1e-6)
            ref = ops.rms_norm.impls["native"].impl_fn(x.cpu(), w.cpu(), 1e-6)
            g = ops.silu_and_mul(torch.randn(3, 16).to(p.device(index)))
            results[f"dev{index}_run"] = [choice.provider, str(y.device),
                                          torch.allclose(y.cpu(), ref, atol=1e-5),
                                          str(g.device), rsqrt() - before]
        cfg = selector.AttentionSelectorConfig(head_size=64, num_heads=8, num_kv_heads=2,
                                               dtype=torch.float16, block_size=16,
                                               device_type="vdev")
        results["attn"] = selector.get_attn_backend(cfg).name
        print(json.dumps(results))
        """,
        env={"OPCORE_VDEV": "1", "OPCORE_VDEV_DEVICES": "2"},
    )
    assert out["name"] == "vdev" and out["count"] == 2 and out["dev1"] == "vdev:1"
    assert out["dtypes"] == ["torch.float32", "torch.float16", "torch.bfloat16"]
    # chosen, run on the device it was given, right, and computed by the device's kernels
    assert out["dev0_run"] == ["vdev", "vdev:0", True, "vdev:0", 1]
    assert out["dev1_run"] == ["vdev", "vdev:1", True, "vdev:1", 1]
    assert out["attn"] == "VDEV"
