"""Paged attention on one GPU: TRITON_PAGED conformance over the full grid, the
decode-attention benchmark, and (``--sweep``) a decode kernel-configuration sweep.

Decode benchmark (`opcore.attention.bench.decode_attention_records`): Llama-style layer
(32 query heads over 8 kv heads, head size 128, bf16, block size 16), batch 1..256,
context 1k..32k, each sequence's blocks scattered at random over the cache. Per shape: the
eager and CUDA-graph medians of one TRITON_PAGED decode call, the bytes that must be read
at least once (every sequence's K and V), that over the graph time as TB/s and as a share
of the datasheet (4.8 TB/s) and of the measured copy bandwidth, and
`torch.nn.functional.scaled_dot_product_attention` on the same KV, dense and with the
gather from the paged cache.

Usage: python bench/attention_decode.py [--quick] [--sweep] [--skip conformance,bench] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time

import torch

from opcore.bench.report import write_json

DATASHEET_TBPS = 4.8


def env_line() -> str:
    import triton

    props = torch.cuda.get_device_properties(0)
    return (
        f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; GPU {props.name} "
        f"({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB); "
        f"torch {torch.__version__} (CUDA {torch.version.cuda}); triton {triton.__version__}; "
        f"python {sys.version.split()[0]}"
    )


def copy_bandwidth() -> float:
    from triton.testing import do_bench

    n = 2 * 2**30 // 2
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    return 2 * a.numel() * 2 / (ms * 1e-3) / 1e12


def conformance(quick: bool, log, shard: tuple[int, int] = (0, 1)) -> tuple[int, int]:
    """The attention conformance grid on the GPU; ``shard = (i, n)`` takes every n-th case
    from the i-th (parallel processes split the grid: each case builds its own kernel
    variant, which dominates the time)."""
    from opcore.attention import testing

    passed = failed = skipped = 0
    worst: dict[str, float] = {}
    i, n = shard
    for backend in ("TRITON_PAGED", "TORCH_NATIVE"):
        cases = list(testing.conformance_cases(quick=quick or backend == "TORCH_NATIVE"))[i::n]
        for case in cases:
            reasons = testing.case_reasons(backend, case, "cuda")
            if reasons:
                skipped += 1
                log(f"SKIP {backend} {case.name}: {reasons}")
                continue
            try:
                r = testing.run_case(backend, case, "cuda")
            except Exception as exc:  # report every failure, keep going
                failed += 1
                log(f"ERROR {backend} {case.name}: {type(exc).__name__}: {exc}")
                continue
            key = f"{backend} {testing.dtype_name(case.dtype)}"
            worst[key] = max(worst.get(key, 0.0), r.max_rel_err / r.rtol)
            if r.passed:
                passed += 1
            else:
                failed += 1
                log(f"FAIL {backend} {case.name}: {r}")
    log(f"conformance on cuda: {passed} passed, {failed} failed, {skipped} skipped")
    for key, v in sorted(worst.items()):
        log(f"  worst max_rel_err/rtol {key}: {v:.3f}")
    return passed, failed


def build_decode(
    batch: int, ctx: int, *, heads=32, kv_heads=8, head=128, block=16, dtype=torch.bfloat16
):
    from opcore.attention import PagedAttentionMetadata

    blocks_per_seq = math.ceil(ctx / block)
    num_blocks = batch * blocks_per_seq
    cache = torch.empty((2, num_blocks, block, kv_heads, head), device="cuda", dtype=dtype)
    cache.normal_()
    table = (
        torch.randperm(num_blocks, device="cuda", dtype=torch.int64)
        .to(torch.int32)
        .view(batch, blocks_per_seq)
    )
    q = torch.randn((batch, heads, head), device="cuda", dtype=dtype)
    md = PagedAttentionMetadata.build(
        torch.arange(batch + 1, device="cuda", dtype=torch.int32),
        torch.full((batch,), ctx, device="cuda", dtype=torch.int32),
        table,
    )
    return cache, table, q, md


def make_impl(**knobs):
    from opcore.attention.backends.triton_paged import TritonPagedBackend

    impl = TritonPagedBackend(32, 128, 8, 128**-0.5)
    for k, v in knobs.items():
        setattr(impl, k, v)
    return impl


def sweep(log) -> list[dict]:

    rows = []
    for batch, ctx in ((64, 8192), (8, 32768)):
        rows += sweep_one(batch, ctx, log)
        torch.cuda.empty_cache()
    return rows


def sweep_one(batch: int, ctx: int, log) -> list[dict]:
    from triton.testing import do_bench

    rows = []
    cache, table, q, md = build_decode(batch, ctx)
    nbytes = cache.numel() * cache.element_size()
    configs = (
        [
            dict(decode_block_n=n, decode_num_warps=w, decode_num_stages=st)
            for n in (32, 64, 128)
            for w in (4, 8)
            for st in (2, 3)
        ]
        + [dict(num_splits=sp) for sp in (1, 2, 4, 8, 16)]
        + [dict(decode_programs_per_sm=p) for p in (2, 8)]
    )
    for knobs in configs:
        impl = make_impl(**knobs)
        label = " ".join(f"{k.replace('decode_', '')}={v}" for k, v in knobs.items())
        try:
            ms = do_bench(
                lambda impl=impl: impl.forward(q, cache, md),
                warmup=10,
                rep=40,
                return_mode="median",
            )
        except Exception as exc:
            log(f"sweep B={batch} ctx={ctx} {label}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        tbps = nbytes / (ms * 1e-3) / 1e12
        rows.append(dict(batch=batch, ctx=ctx, config=label, us=ms * 1e3, tbps=tbps))
        log(f"sweep B={batch} ctx={ctx} {label}: {ms * 1e3:.1f} us {tbps:.2f} TB/s")
    best = max(rows, key=lambda r: r["tbps"], default=None)
    if best:
        log(
            f"sweep best B={batch} ctx={ctx}: {best['config']} {best['us']:.1f} us "
            f"{best['tbps']:.2f} TB/s"
        )
    return rows


def bench(batches, contexts, copy_tbps, log) -> list[dict]:
    from opcore.attention.bench import decode_attention_records

    records = decode_attention_records(
        batches, contexts, device="cuda", copy_gbs=copy_tbps * 1000, log=log
    )
    for r in records:
        if "gbs" in r:
            r["pct_datasheet"] = 100 * r["gbs"] / 1000 / DATASHEET_TBPS
    log("summary (% of the 4.8 TB/s datasheet bandwidth, CUDA-graph time):")
    for r in records:
        if "gbs" in r:
            log(
                f"  B={r['batch']:4d} ctx={r['context']:6d}: {r['pct_datasheet']:5.1f}%  "
                f"triton {r['graph_us']:8.1f} us  sdpa dense {r['sdpa_dense_us']:8.1f} us  "
                f"gather+sdpa {r['sdpa_gather_us']:8.1f} us"
            )
    return records


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip", default="", help="comma list of: conformance,sweep,bench")
    ap.add_argument("--shard", default="0/1", help="I/N: the conformance cases i, i+n, ...")
    ap.add_argument(
        "--sweep", action="store_true", help="also run the decode kernel-configuration sweep"
    )
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    shard_i, shard_n = (int(x) for x in args.shard.split("/"))
    if not 0 <= shard_i < shard_n:
        ap.error(f"--shard {args.shard}: expected I/N with 0 <= I < N")
    os.makedirs(args.out, exist_ok=True)
    lines = []
    logfile = open(os.path.join(args.out, "attention_h200.log"), "w")  # noqa: SIM115

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)
        logfile.write(msg + "\n")
        logfile.flush()

    log(env_line())
    t0 = time.time()
    copy_tbps = copy_bandwidth()
    log(f"device-to-device copy: {copy_tbps:.2f} TB/s (bytes read + written)")
    result = {"env": lines[0], "copy_tbps": copy_tbps}
    if "conformance" not in skip:
        result["conformance"] = conformance(args.quick, log, (shard_i, shard_n))
        log(f"[{time.time() - t0:.0f}s]")
        _dump(args.out, result)
    if "bench" not in skip:
        batches = (1, 8, 64, 256) if args.quick else (1, 8, 32, 64, 128, 256)
        contexts = (1024, 4096, 32768) if args.quick else (1024, 4096, 16384, 32768)
        result["bench"] = bench(batches, contexts, copy_tbps, log)
        log(f"[{time.time() - t0:.0f}s]")
        _dump(args.out, result)
    if args.sweep and "sweep" not in skip:
        result["sweep"] = sweep(log)
        log(f"[{time.time() - t0:.0f}s]")
    _dump(args.out, result)
    logfile.close()
    return 0


def _dump(out: str, result: dict) -> None:
    write_json(result, os.path.join(out, "attention_h200.json"))


if __name__ == "__main__":
    sys.exit(main())
