"""Check that each op's native provider is traced by XLA without host round-trips or graph
breaks. Run on an XLA device (``PJRT_DEVICE=CPU`` gives XLA:CPU) in a torch_xla venv:

    PJRT_DEVICE=CPU python plugins/tpu/scripts/check_xla_tracing.py

For every op and a few of its samples (already on the device): one warm-up step (call,
``torch_xla.sync()``), then the metrics are cleared and one measured step calls the op
three times, feeding each output back in where shapes allow, and syncs once. Expected:

* ``ExecuteTime`` 1 sample (read after ``wait_device_ops``: execution is asynchronous):
  the three calls are one graph (no graph break);
* ``CompileTime`` 0 samples: the graph of a repeated step is a cache hit;
* ``TransferFromDeviceTime`` 0 samples: nothing read back to the host during the step;
* no ``aten::*`` counter: no op fell back to the CPU.

Prints a Markdown table and exits 1 if any row violates these.
"""

from __future__ import annotations

import sys

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

from opcore.ir import all_ops, ops

SAMPLES_PER_OP = 3
CALLS = 3


def _metric_count(name: str) -> int:
    data = met.metric_data(name)
    return 0 if data is None else int(data[0])


def _fallbacks() -> list[str]:
    return sorted(n for n in met.counter_names() if n.startswith("aten::"))


def _step(op, args, kwargs):
    out = None
    for _ in range(CALLS):
        out = op(*args, **kwargs)
    torch_xla.sync()
    # Execution is asynchronous: wait, so its metrics are recorded before they are read
    # (and before they are cleared).
    xm.wait_device_ops()
    return out


def main() -> int:
    device = torch_xla.device()
    rows, bad = [], 0
    for name, op in all_ops().items():
        for i, sample in enumerate(op.sample_inputs(device, torch.bfloat16)):
            if i >= SAMPLES_PER_OP:
                break
            args, kwargs = sample.args, dict(sample.kwargs)
            torch_xla.sync()
            _step(op, args, kwargs)  # warm-up: compiles the step's graph
            met.clear_all()
            _step(op, args, kwargs)
            execs = _metric_count("ExecuteTime")
            compiles = _metric_count("CompileTime")
            to_host = _metric_count("TransferFromDeviceTime")
            fallbacks = _fallbacks()
            ok = execs == 1 and compiles == 0 and to_host == 0 and not fallbacks
            bad += not ok
            provider = op.dispatch(*args, **kwargs).provider
            rows.append(
                f"| {name} | {sample.name} | {provider} | {execs} | {compiles} | {to_host} | "
                f"{', '.join(fallbacks) or 'none'} | {'ok' if ok else 'VIOLATION'} |"
            )
    print(
        f"Device: {device} ({torch_xla.runtime.device_type()}), torch {torch.__version__}, "
        f"torch_xla {torch_xla.__version__}; {CALLS} calls per measured step, bf16 samples."
    )
    print()
    print(
        "| op | sample | provider | graphs executed | compiles | device->host transfers "
        "| CPU fallbacks | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print(f"{len(rows) - bad} of {len(rows)} rows ok")
    assert ops.rms_norm is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
