"""The PrivateUse1 path of ``torch.ops.opcore_ir.*`` on the virtual device: opcore registers
its ops at CompositeExplicitAutograd so they run on any backend key; here they run on a
renamed PrivateUse1 device, eagerly, through ``maybe_inplace``, on fake tensors, and under
``torch.compile`` with the ``eager`` and ``aot_eager`` backends (Inductor has no code
generator for this device). One fresh interpreter: PrivateUse1 is renamed once per process.
"""

from __future__ import annotations

import json

from opcore.testing import run_python

CODE = r"""
import json, torch
from torch._subclasses.fake_tensor import FakeTensorMode
from opcore import vdev
from opcore.ir import ops
from opcore.platforms import current_platform as p

dev = p.device(0)
counts = vdev.installed().op_counts
out = {}
torch.manual_seed(0)
x_cpu, r_cpu, w_cpu = torch.randn(5, 64), torch.randn(5, 64), torch.randn(64)
x, r, w = x_cpu.to(dev), r_cpu.to(dev), w_cpu.to(dev)

# eager, through the torch dispatcher: the CompositeExplicitAutograd kernel on PrivateUse1
before = sum(counts.values())
y = torch.ops.opcore_ir.rms_norm(x, w, 1e-6)
y_cpu = torch.ops.opcore_ir.rms_norm(x_cpu, w_cpu, 1e-6)
out["eager"] = [str(y.device), torch.allclose(y.cpu(), y_cpu, atol=1e-5),
                sum(counts.values()) > before]

# maybe_inplace may write into the donated activations; the default overload never does
xd, rd = x.clone(), r.clone()
o, res = torch.ops.opcore_ir.fused_add_rms_norm.maybe_inplace(xd, rd, w, 1e-6)
o2, res2 = torch.ops.opcore_ir.fused_add_rms_norm(x, r, w, 1e-6)
out["maybe_inplace"] = [str(o.device), str(res.device),
                        torch.allclose(res.cpu(), (x_cpu + r_cpu), atol=1e-6),
                        torch.allclose(o.cpu(), o2.cpu(), atol=1e-6), torch.equal(x.cpu(), x_cpu)]

# fake tensors: the fake implementation keeps the device and reads no values
with FakeTensorMode() as mode:
    fx, fw = mode.from_tensor(x), mode.from_tensor(w)
    fy = torch.ops.opcore_ir.rms_norm(fx, fw, 1e-6)
    fo, fres = torch.ops.opcore_ir.fused_add_rms_norm(fx, mode.from_tensor(r), fw, 1e-6)
    fg = torch.ops.opcore_ir.silu_and_mul(mode.from_tensor(torch.randn(3, 32).to(dev)))
out["fake"] = [str(fy.device), list(fy.shape), str(fo.device), str(fres.device),
               str(fg.device), list(fg.shape)]

# torch.compile: one opaque node per op; the compiled graph runs on the device
def model(x, r, w):
    h, res = ops.fused_add_rms_norm(x, r, w, 1e-6)
    return ops.silu_and_mul(h), res

want = model(x, r, w)
for backend in ("eager", "aot_eager"):
    torch._dynamo.reset()
    got = torch.compile(model, backend=backend, fullgraph=True)(x, r, w)
    out["compile_" + backend] = [str(got[0].device), str(got[1].device),
                    all(torch.allclose(g.cpu(), e.cpu(), atol=1e-5) for g, e in zip(got, want))]
print(json.dumps(out))
"""


def test_opcore_ir_ops_on_the_privateuse1_device():
    proc = run_python(CODE, env={"OPCORE_VDEV": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["eager"] == ["vdev:0", True, True]
    assert out["maybe_inplace"] == ["vdev:0", "vdev:0", True, True, True]
    assert out["fake"] == ["vdev:0", [5, 64], "vdev:0", "vdev:0", "vdev:0", [3, 16]]
    assert out["compile_eager"] == out["compile_aot_eager"] == ["vdev:0", "vdev:0", True]
