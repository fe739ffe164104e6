"""Run the Ascend plugin's NPU-tiled Triton ``split_qkv_rmsnorm_rope`` on an NVIDIA GPU.

The kernel is portable Triton, so the GPU is the closest compiled (non-interpreted) check
this project can give it. No torch_npu and no installed opcore are needed:

    PYTHONPATH=sdk/src:plugins/ascend/src python plugins/ascend/scripts/check_triton_on_gpu.py

For each case it compares the kernel (grid = the GPU's multiprocessor count standing in
for the NPU's vector cores; chunks sized for the NPU's 85 KiB unified buffer) against a
float64 reference (the op's native function on the CPU, as in the conformance suite), and
times it with ``triton.testing.do_bench`` next to that native function in eager mode on
the GPU (the unfused chain). "first call"
is the first launch including Triton's compilation (heads are unrolled, so it grows with
the head count). Prints a Markdown table line by line (and writes it to
``$OUT/ascend_triton_gpu.md`` when ``OUT`` is set); exits 1 on any mismatch. Timings are
informative only: the kernel is tiled for an NPU, not tuned for this GPU.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import triton
from triton.testing import do_bench

from opcore.ir import ops
from opcore_plugin_ascend import triton_qkv

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# tokens, q heads, kv heads, head size, rot dim, NeoX style
CASES = [
    (1, 32, 8, 128, 128, True),
    (16, 16, 2, 128, 64, True),
    (16, 16, 2, 128, 64, False),
    (333, 12, 1, 128, 128, False),
    (1024, 32, 8, 128, 128, True),
    (4096, 64, 4, 128, 64, True),
    (77, 8, 2, 80, 32, True),
]


NATIVE = ops.split_qkv_rmsnorm_rope.native  # the op's reference; unfused eager chain on a GPU


def reference(qkv, qw, kw, eps, positions, cache, nh, nkv, d, is_neox):
    """The native function in float64 on the CPU (as the conformance suite's reference)."""

    def f64(t):
        return t.double().cpu()

    return NATIVE(f64(qkv), f64(qw), f64(kw), eps, positions.cpu(), f64(cache), nh, nkv, d, is_neox)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    dev = torch.device("cuda")
    programs = triton_qkv.vector_core_count(dev)
    lines = [
        f"Device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
        f"triton {triton.__version__}; grid = {programs} programs (multiprocessors), "
        f"unified-buffer budget {triton_qkv.DEFAULT_UB_BYTES} B",
        "",
        "| tokens | heads q/kv | head | rot | style | dtype | rows/chunk | max err q | max err k "
        "| v exact | verdict | first call s | tiled us | native eager us |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out_dir = os.environ.get("OUT")
    report = (
        open(os.path.join(out_dir, "ascend_triton_gpu.md"), "w", encoding="utf-8")
        if out_dir
        else None
    )

    def emit(line: str) -> None:
        # Line by line, so a run cut short by a time limit still leaves what it checked.
        print(line, flush=True)
        if report:
            report.write(line + "\n")
            report.flush()

    for line in lines:
        emit(line)
    failures = 0
    g = torch.Generator(device="cpu").manual_seed(0)
    for tokens, nh, nkv, d, rot, neox in CASES:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            width = (nh + 2 * nkv) * d
            qkv = torch.randn(tokens, width, generator=g).to(dtype).to(dev)
            qw = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype).to(dev)
            kw = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype).to(dev)
            cache = torch.randn(4096, rot, generator=g).to(dev)
            pos = torch.randint(0, 4096, (tokens,), generator=g).to(dev)
            args = (qkv, qw, kw, 1e-6, pos, cache, nh, nkv, d, neox)
            start = time.perf_counter()
            q, k, v = triton_qkv.split_qkv_rmsnorm_rope_tiled(*args)
            torch.cuda.synchronize()
            first_call_s = time.perf_counter() - start
            rq, rk, rv = reference(*args)
            err_q = float((q.double().cpu() - rq).abs().max())
            err_k = float((k.double().cpu() - rk).abs().max())
            v_ok = bool(torch.equal(v.double().cpu(), rv))
            tol = TOL[dtype]
            ok = (
                torch.allclose(q.double().cpu(), rq, atol=tol, rtol=tol)
                and torch.allclose(k.double().cpu(), rk, atol=tol, rtol=tol)
                and v_ok
            )
            failures += not ok
            t_tiled = do_bench(lambda a=args: triton_qkv.split_qkv_rmsnorm_rope_tiled(*a)) * 1e3
            t_native = do_bench(lambda a=args: NATIVE(*a)) * 1e3
            rows = min(
                triton_qkv.rows_per_chunk(d),
                triton_qkv.next_pow2(-(-tokens // min(programs, tokens))),
            )
            emit(
                f"| {tokens} | {nh}/{nkv} | {d} | {rot} | {'neox' if neox else 'gptj'} | "
                f"{str(dtype).removeprefix('torch.')} | {rows} | {err_q:.2e} | {err_k:.2e} | "
                f"{v_ok} | "
                f"{'ok' if ok else 'FAIL'} | {first_call_s:.1f} | {t_tiled:.1f} | {t_native:.1f} |"
            )
    emit("")
    emit(f"FAIL: {failures} case(s)" if failures else "all cases match the float64 reference")
    if report:
        report.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
