"""Run the Ascend plugin's NPU-tiled Triton ``split_qkv_rmsnorm_rope`` on an NVIDIA GPU.

The kernel is portable Triton, so the GPU is the closest compiled (non-interpreted) check
this project can give it. No torch_npu and no installed opcore are needed:

    PYTHONPATH=sdk/src:plugins/ascend/src python plugins/ascend/scripts/check_triton_on_gpu.py

For each case it compares the kernel (grid = the GPU's multiprocessor count standing in
for the NPU's vector cores; chunks sized for the NPU's 85 KiB unified buffer) against a
float64 reference computed on the CPU from the op's definition, and times it with
``triton.testing.do_bench`` next to the unfused native op in eager mode. "first call"
is the first launch including Triton's compilation (heads are unrolled, so it grows with
the head count). Prints a Markdown table line by line (and writes it to
``$OUT/ascend_triton_gpu.md`` when ``OUT`` is set); exits 1 on any mismatch. Timings are informative only: the kernel is tiled for an NPU, not tuned for
this GPU.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import triton
from triton.testing import do_bench

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


def reference(qkv, qw, kw, eps, positions, cache, nh, nkv, d, is_neox):
    n = positions.numel()
    x = qkv.double().cpu().reshape(n, -1)
    rot = cache.shape[1]
    half = rot // 2
    c = cache.double().cpu()[positions.cpu().reshape(-1)]
    cos, sin = c[:, None, :half], c[:, None, half:]

    def part(t, heads, w):
        t = t.reshape(n, heads, d)
        t = t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.double().cpu()
        r = t[..., :rot]
        if is_neox:
            a, b = r[..., :half], r[..., half:]
            r = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
        else:
            a, b = r[..., 0::2], r[..., 1::2]
            r = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
        return torch.cat([r, t[..., rot:]], -1).reshape(n, heads * d)

    return (
        part(x[:, : nh * d], nh, qw),
        part(x[:, nh * d : (nh + nkv) * d], nkv, kw),
        x[:, (nh + nkv) * d :],
    )


def native_chain(qkv, qw, kw, eps, positions, cache, nh, nkv, d, is_neox):
    """The unfused eager chain (what a model runs without a fused kernel)."""
    n = positions.numel()
    rot = cache.shape[1]
    half = rot // 2
    cs = cache.index_select(0, positions).float()
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)

    def part(t, heads, w):
        t = t.float().reshape(n, heads, d)
        t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.float()
        r, rest = t[..., :rot], t[..., rot:]
        if is_neox:
            a, b = r[..., :half], r[..., half:]
            r = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
        else:
            a, b = r[..., 0::2], r[..., 1::2]
            r = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
        return torch.cat([r, rest], -1).to(qkv.dtype).reshape(n, heads * d)

    return part(q, nh, qw), part(k, nkv, kw), v.contiguous()


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    dev = torch.device("cuda")
    programs = triton_qkv.vector_core_count(dev)
    lines = [
        f"Device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}; "
        f"grid = {programs} programs (multiprocessors), unified-buffer budget {triton_qkv.DEFAULT_UB_BYTES} B",
        "",
        "| tokens | heads q/kv | head | rot | style | dtype | rows/chunk | max err q | max err k | v exact | verdict | first call s | tiled us | native eager us |",
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
            t_native = do_bench(lambda a=args: native_chain(*a)) * 1e3
            rows = min(
                triton_qkv.rows_per_chunk(d),
                triton_qkv.next_pow2(-(-tokens // min(programs, tokens))),
            )
            emit(
                f"| {tokens} | {nh}/{nkv} | {d} | {rot} | {'neox' if neox else 'gptj'} | "
                f"{str(dtype).removeprefix('torch.')} | {rows} | {err_q:.2e} | {err_k:.2e} | {v_ok} | "
                f"{'ok' if ok else 'FAIL'} | {first_call_s:.1f} | {t_tiled:.1f} | {t_native:.1f} |"
            )
    emit("")
    emit(f"FAIL: {failures} case(s)" if failures else "all cases match the float64 reference")
    if report:
        report.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
