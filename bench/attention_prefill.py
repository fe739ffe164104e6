"""Prefill attention on one device (issue 29): ``TRITON_PAGED`` over a paged KV cache
against PyTorch's SDPA, in TFLOP/s with spread.

Per row (a causal problem: ``batch`` sequences of ``q_len`` new tokens over ``ctx`` tokens
of context, ``heads``/``kv_heads`` x ``head_size``, a dtype, a page size; each sequence's
pages scattered at random over the cache), the same queries, keys and values through:

- ``paged_prefill``: ``TRITON_PAGED.forward`` (its prefill kernel, `_triton_prefill`), as a
  user gets it: K/V tiles through tensor descriptors where the platform copies them in
  hardware and a page holds whole key tiles (``kv_descriptors`` says which rows);
- ``paged_pointers``: the same with ``prefill_kv_descriptors = False`` (pointer loads);
- ``legacy``: ``TRITON_PAGED.forward`` with ``prefill_path = "legacy"`` (the kernel before
  issue 29);
- ``sdpa_flash``: ``F.scaled_dot_product_attention`` on contiguous ``[B, H, L, D]`` K/V
  (``enable_gqa=True``), the flash backend only where the device has it. A chunk
  (``q_len < ctx``) uses the bottom-right causal mask (``causal_lower_right``), the dense
  equivalent of a chunk over its cached prefix;
- ``sdpa_flash_mha``: the same SDPA call with K/V repeated to every query head beforehand
  (contiguous ``[B, H, L, D]``, the repeat not timed): the form a user who expands GQA
  themselves, or an MHA model, would time. ``ratio_vs_best_sdpa`` compares with the faster
  of the two flash forms;
- ``sdpa_gather``: the gather of K/V from the same pages into contiguous tensors, then the
  same SDPA call (the gather is timed);
- ``sdpa_cudnn``: the ``sdpa_flash`` call restricted to cuDNN's attention backend instead,
  and ``sdpa_default``: the call with no backend restriction, as a user who never picks
  one gets it. A backend the device or build refuses is recorded as refused, with the
  reason (``cudnn_form``). The
  ratio to the best SDPA (``ratio_vs_best_sdpa``) takes the fastest of every SDPA form
  timed.

TFLOP/s counts the causal part only: ``4 * heads * head_size * sum_i visible(i)`` with
``visible(i) = ctx - q_len + i + 1``. Each provider is timed with
``triton.testing.do_bench`` (median and quartiles; the host clock on the CPU). The error of
``paged_prefill`` and ``legacy`` against ``sdpa_flash`` is recorded too.

``mixed`` rows time one mixed batch (a chunk plus decode rows) against its decode part and
its prefill part run alone (``--mixed-only``: that row alone).

``--rounds N`` times a row's providers in turn N times, the order rotated each round, and
reports the median and quartiles of the round medians: a drift of the clock during a row
(two identical launches of one 16 x 1024 row differed by 15 % on an H100, timed one after
the other) then spreads over every provider instead of favouring the first.
``--interleave PASSES`` times call by call instead (`time_interleaved`): each pass calls
every provider once in a shuffled order, so none is always timed after the same one (a
GPU's clock follows the previous kernel's power draw).

Grid (issue 29): batch x tokens 1x2048, 1x8192, 4x4096, 16x1024; heads 32/8, 64/8, 28/4;
head size 128; bf16 and fp16; block sizes 16 and 128; head sizes 64 and 256 (32/8, bf16,
blocks 16 and 128); whole prompts of 16k and 32k tokens and block sizes 32 and 64 (32/8 x
128, bf16); chunked prefill, chunk 512 and 2048 over prefixes of 4k and 32k tokens. The
issue's own table (bf16, blocks of 16, 32/8 heads, at every head size and length) comes
first; rows run in order until ``--budget-s`` is spent (the rest are listed as not
measured).

``--quick``: tiny shapes on the CPU under Triton's interpreter (set here when there is no
GPU), to check the script runs; its timings mean nothing.

``--only field=value,...`` keeps the rows (with ``--sweep``, the problems) whose fields have
those values.

Usage: python bench/attention_prefill.py [--quick] [--out DIR] [--rep-ms 50] [--budget-s 200]
       [--limit N] [--only block_size=128,heads=32] [--rounds 3] [--mixed-only]
       [--sweep [--sweep-set tma|pack|rows|short]]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time

from opcore.bench.report import write_json

PROVIDERS = (
    "paged_prefill",
    "paged_pointers",
    "legacy",
    "sdpa_flash",
    "sdpa_flash_mha",
    "sdpa_gather",
    "sdpa_cudnn",
    "sdpa_default",
)
SDPA_DENSE = ("sdpa_flash", "sdpa_flash_mha", "sdpa_cudnn", "sdpa_default")


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def grid(quick: bool) -> list[dict]:
    """The rows: dicts of batch, q_len, ctx, heads, kv_heads, head_size, dtype, block_size."""
    if quick:
        base = dict(heads=4, kv_heads=2, head_size=64, dtype="float16")
        return [
            dict(base, batch=1, q_len=129, ctx=129, block_size=16),
            dict(base, batch=2, q_len=64, ctx=64, block_size=128, dtype="bfloat16"),
            dict(base, batch=1, q_len=64, ctx=200, block_size=16),
        ]
    rows = []
    shapes = ((1, 2048), (1, 8192), (4, 4096), (16, 1024))
    for dtype in ("bfloat16", "float16"):
        for bs in (16, 128):
            for heads, kv in ((32, 8), (64, 8), (28, 4)):
                for b, n in shapes:
                    rows.append(
                        dict(batch=b, q_len=n, ctx=n, heads=heads, kv_heads=kv, head_size=128,
                             dtype=dtype, block_size=bs)
                    )  # fmt: skip
    for bs in (16, 128):
        for hd in (64, 256):
            for b, n in shapes:
                rows.append(
                    dict(batch=b, q_len=n, ctx=n, heads=32, kv_heads=8, head_size=hd,
                         dtype="bfloat16", block_size=bs)
                )  # fmt: skip
    # The range reaches 32k-token prompts and every page size from 16 to 128.
    for bs in (16, 128):
        for n in (16384, 32768):
            rows.append(
                dict(batch=1, q_len=n, ctx=n, heads=32, kv_heads=8, head_size=128,
                     dtype="bfloat16", block_size=bs)
            )  # fmt: skip
    for bs in (32, 64):
        for b, n in shapes:
            rows.append(
                dict(batch=b, q_len=n, ctx=n, heads=32, kv_heads=8, head_size=128,
                     dtype="bfloat16", block_size=bs)
            )  # fmt: skip
    for bs in (16, 128):
        for prefix in (4096, 32768):
            for chunk in (512, 2048):
                rows.append(
                    dict(batch=1, q_len=chunk, ctx=prefix + chunk, heads=32, kv_heads=8,
                         head_size=128, dtype="bfloat16", block_size=bs)
                )  # fmt: skip
    # The table first: bf16, block 16, 32/8 x 128.
    rows.sort(key=lambda r: (r["dtype"], r["block_size"], r["heads"]) != ("bfloat16", 16, 32))
    return rows


def causal_flops(batch: int, q_len: int, ctx: int, heads: int, head_size: int) -> float:
    visible = q_len * (ctx - q_len) + q_len * (q_len + 1) // 2
    return 4.0 * batch * heads * head_size * visible


def timer(device: str, rep_ms: int):
    """``time(fn) -> (median, q25, q75)`` in milliseconds."""
    if device == "cuda":
        from triton.testing import do_bench

        def time_cuda(fn):
            q25, med, q75 = do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms,
                                     quantiles=[0.25, 0.5, 0.75])  # fmt: skip
            return med, q25, q75

        return time_cuda

    def time_host(fn):
        fn()
        samples = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1e3)
        q = statistics.quantiles(samples, n=4, method="inclusive")
        return statistics.median(samples), q[0], q[2]

    return time_host


def time_rounds(fns: dict, time_fn, rounds: int = 1) -> dict:
    """``{name: (median, q25, q75, round medians)}`` for callables timed in turn: each of
    ``rounds`` rounds times every callable once (``time_fn``), the order rotated by one per
    round, so a clock or temperature drift during the row spreads over all of them instead
    of favouring the first. With several rounds the median and quartiles are those of the
    round medians."""
    from opcore.bench.runner import rotated

    names = list(fns)
    per = {n: [] for n in names}
    for r in range(rounds):
        for n in rotated(names, r):
            per[n].append(time_fn(fns[n]))
    out = {}
    for n, samples in per.items():
        if len(samples) == 1:
            med, q25, q75 = samples[0]
        else:
            meds = [m for m, _, _ in samples]
            q25, _, q75 = statistics.quantiles(meds, n=4, method="inclusive")
            med = statistics.median(meds)
        out[n] = (med, q25, q75, [m for m, _, _ in samples])
    return out


def time_interleaved(fns: dict, device: str, reps: int, seed: int = 0) -> dict:
    """`time_rounds`'s result for callables timed call by call: each of ``reps`` passes
    calls every callable once, in an order shuffled per pass (seeded), each call after a
    cache flush (`opcore.bench.timing.FLUSH_BYTES`) and between two of the platform's
    timing events (`~opcore.bench.timing.event_times_ms`; the host clock on the CPU). A GPU's
    clock follows its power draw, so a kernel timed in a block right after a hungrier one
    (cuDNN's attention) runs slower than the same kernel timed after a lighter one: in
    blocks (`time_rounds`), two identical launches of this backend differed by 2-5 %.
    Interleaved, every callable sees every predecessor about equally often. The quartiles
    are those of each callable's samples; the round medians are its pass-by-pass times."""
    import random

    import torch

    from opcore.bench import timing
    from opcore.platforms import get_current_platform

    names = list(fns)
    order = random.Random(seed)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for fn in fns.values():
        fn()
    platform = get_current_platform() if device == "cuda" else None
    flush = (
        torch.empty(timing.FLUSH_BYTES // 4, dtype=torch.int32, device=device) if platform else None
    )
    for _ in range(reps):
        step = names[:]
        order.shuffle(step)
        if platform is not None:  # one synchronize a pass: a bounded queue
            ms = timing.event_times_ms(platform, [fns[n] for n in step], before=flush.zero_)
        else:
            ms = []
            for n in step:
                t = time.perf_counter()
                fns[n]()
                ms.append((time.perf_counter() - t) * 1e3)
        for n, m in zip(step, ms, strict=True):
            samples[n].append(m)
    out = {}
    for n, xs in samples.items():
        if len(xs) > 1:
            q25, med, q75 = statistics.quantiles(xs, n=4, method="inclusive")
        else:
            q25 = med = q75 = xs[0]
        out[n] = (med, q25, q75, xs)
    return out


def time_providers(fns: dict, time_fn, rounds: int, interleave: int, device: str) -> dict:
    """`time_interleaved` with ``interleave`` passes when it is positive, else
    `time_rounds`."""
    if interleave > 0:
        return time_interleaved(fns, device, interleave)
    return time_rounds(fns, time_fn, rounds)


class Problem:
    """One row's inputs: dense Q/K/V, the same K/V in a paged cache, metadata, backends."""

    def __init__(self, row: dict, device: str, seed: int = 0) -> None:
        import torch

        from opcore.attention import PagedAttentionMetadata
        from opcore.attention.backends.triton_paged import TritonPagedBackend

        dtype = getattr(torch, row["dtype"])
        b, n, ctx = row["batch"], row["q_len"], row["ctx"]
        h, kv, d, bs = row["heads"], row["kv_heads"], row["head_size"], row["block_size"]
        gen = torch.Generator(device=device).manual_seed(seed)
        self.scale = d**-0.5
        self.q = torch.randn((b * n, h, d), generator=gen, device=device, dtype=dtype)
        self.k = torch.randn((b, ctx, kv, d), generator=gen, device=device, dtype=dtype)
        self.v = torch.randn((b, ctx, kv, d), generator=gen, device=device, dtype=dtype)
        pages = -(-ctx // bs)
        num_blocks = b * pages + 1
        perm = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
        self.table = perm[: b * pages].view(b, pages).contiguous()
        self.cache = TritonPagedBackend.allocate_kv_cache(num_blocks, bs, kv, d, dtype, device)
        self.cache.zero_()
        pad = pages * bs - ctx
        for i, src in enumerate((self.k, self.v)):
            full = torch.nn.functional.pad(src, (0, 0, 0, 0, 0, pad))
            self.cache[i][self.table.long()] = full.view(b, pages, bs, kv, d)
        self.metadata = PagedAttentionMetadata.build(
            torch.arange(b + 1, device=device, dtype=torch.int32) * n,
            torch.full((b,), ctx, device=device, dtype=torch.int32),
            self.table,
        )
        self.metadata.check_cache(num_blocks, bs)
        self.new = TritonPagedBackend(h, d, kv, self.scale)
        self.old = TritonPagedBackend(h, d, kv, self.scale)
        self.old.prefill_path = "legacy"
        # The prefill kernel with pointer loads only (no tensor descriptors for K/V).
        self.ptr = TritonPagedBackend(h, d, kv, self.scale)
        self.ptr.prefill_kv_descriptors = False
        self.out = torch.empty_like(self.q)
        self.row = row
        # [B, H, L, D] views for SDPA.
        self.q4 = self.q.view(b, n, h, d).transpose(1, 2)
        self.k4 = self.k.transpose(1, 2)
        self.v4 = self.v.transpose(1, 2)
        self.device = device
        self.sdpa_path = None
        self.cudnn_form = "not timed"

    def paged(self, impl):
        return lambda: impl.forward(self.q, self.cache, self.metadata, out=self.out)

    def _sdpa(self, q, k, v):
        import torch.nn.functional as F

        n, ctx = self.row["q_len"], self.row["ctx"]
        if n == ctx:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                                  enable_gqa=True)  # fmt: skip
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(n, ctx)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                              enable_gqa=True)  # fmt: skip

    def sdpa(self, gather: bool, mha: bool = False, backend: str = "flash"):
        """The SDPA callable of one form; ``backend``: "flash", "cudnn" or "default" (no
        restriction). ``None`` where the device refuses that backend."""
        import torch

        kv = (self.k4, self.v4)
        if mha:
            g = self.row["heads"] // self.row["kv_heads"]
            kv = tuple(t.repeat_interleave(g, dim=1).contiguous() for t in kv)

        def dense():
            return self._sdpa(self.q4, *kv)

        def gathered():
            b, ctx = self.row["batch"], self.row["ctx"]
            n_kv, d = self.row["kv_heads"], self.row["head_size"]
            t = self.table.long()
            k = self.cache[0][t].view(b, -1, n_kv, d)[:, :ctx].transpose(1, 2)
            v = self.cache[1][t].view(b, -1, n_kv, d)[:, :ctx].transpose(1, 2)
            return self._sdpa(self.q4, k, v)

        fn = gathered if gather else dense
        if self.device != "cuda":
            if backend == "flash":
                self.sdpa_path = "default (no flash on this device)"
            return fn if backend != "cudnn" else None
        if backend == "default":
            return fn
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = SDPBackend.FLASH_ATTENTION if backend == "flash" else SDPBackend.CUDNN_ATTENTION

        def restricted():
            with sdpa_kernel([chosen]):
                return fn()

        try:
            restricted()
        except RuntimeError as exc:
            torch.cuda.synchronize()
            why = str(exc).splitlines()[0][:120]
            if backend == "flash":
                self.sdpa_path = f"default (flash refused: {why})"
                return fn
            self.cudnn_form = f"refused: {why}"
            return None
        if backend == "flash":
            self.sdpa_path = "flash"
        else:
            self.cudnn_form = "enable_gqa"
        return restricted


def measure_row(row: dict, device: str, time_fn, rounds: int = 1, interleave: int = 0) -> dict:
    import torch

    p = Problem(row, device)
    flops = causal_flops(row["batch"], row["q_len"], row["ctx"], row["heads"], row["head_size"])
    rec = dict(row, flops=flops, providers={}, rounds=rounds, interleave=interleave)
    ref = p.sdpa(False)().transpose(1, 2).reshape(p.q.shape).float()
    fns = {}
    for name in PROVIDERS:
        if name in ("paged_prefill", "paged_pointers", "legacy"):
            fn = p.paged({"paged_prefill": p.new, "paged_pointers": p.ptr, "legacy": p.old}[name])
            got = fn().float()
            rec[f"{name}_max_abs_err"] = float((got - ref).abs().max())
        else:
            backend = {"sdpa_cudnn": "cudnn", "sdpa_default": "default"}.get(name, "flash")
            fn = p.sdpa(name == "sdpa_gather", mha=name == "sdpa_flash_mha", backend=backend)
            if fn is None:
                rec["providers"][name] = None
                continue
            if name != "sdpa_gather":
                got = fn().transpose(1, 2).reshape(p.q.shape).float()
                rec[f"{name}_max_abs_err"] = float((got - ref).abs().max())
        fns[name] = fn
    timed = time_providers(fns, time_fn, rounds, interleave, device)
    for name, (med, q25, q75, meds) in timed.items():
        rec["providers"][name] = {
            "ms": med,
            "ms_q25": q25,
            "ms_q75": q75,
            "ms_rounds": meds,
            # TFLOP/s at the median and at the quartiles of time (fast quartile first).
            "tflops": flops / (med * 1e-3) / 1e12,
            "tflops_q75": flops / (q25 * 1e-3) / 1e12,
            "tflops_q25": flops / (q75 * 1e-3) / 1e12,
        }
    from opcore.attention.backends import _triton_prefill as P

    ready = P.tma_ready(p.cache[0], p.cache[1])
    rec["kv_descriptors"] = P.prefill_launch_config(
        row["head_size"],
        p.q.dtype,
        row["block_size"],
        p.new.kv_descriptors_on(p.q.device) and ready,
        short_context=P.short_context_tiles(row["head_size"], row["ctx"]),
    ).kv_tma
    rec["sdpa_path"] = p.sdpa_path
    rec["cudnn_form"] = p.cudnn_form
    prov = rec["providers"]
    rec["ratio_vs_flash"] = prov["paged_prefill"]["tflops"] / prov["sdpa_flash"]["tflops"]
    best_name = max((n for n in SDPA_DENSE if prov[n]), key=lambda n: prov[n]["tflops"])
    rec["best_sdpa"] = best_name
    rec["ratio_vs_best_sdpa"] = prov["paged_prefill"]["tflops"] / prov[best_name]["tflops"]
    rec["ratio_vs_legacy"] = prov["paged_prefill"]["tflops"] / prov["legacy"]["tflops"]
    rec["ratio_vs_pointers"] = prov["paged_prefill"]["tflops"] / prov["paged_pointers"]["tflops"]
    del p
    if device == "cuda":
        torch.cuda.empty_cache()
    return rec


def measure_mixed(device: str, time_fn, quick: bool, rounds: int = 1, interleave: int = 0) -> dict:
    """One mixed batch (a chunk plus decode rows) against its decode part and its prefill
    part alone, all three through ``TRITON_PAGED.forward`` (`time_providers`)."""
    import torch

    from opcore.attention import PagedAttentionMetadata

    if quick:
        chunk, prefix, decodes, dctx = 70, 60, 3, 100
        row = dict(heads=4, kv_heads=2, head_size=64, dtype="float16", block_size=16)
    else:
        chunk, prefix, decodes, dctx = 2048, 8192, 64, 4096
        row = dict(heads=32, kv_heads=8, head_size=128, dtype="bfloat16", block_size=16)
    # The cache of the longest context, shared: every sequence reads its own pages of it.
    ctx = max(prefix + chunk, dctx)
    p = Problem(dict(row, batch=decodes + 1, q_len=1, ctx=ctx), device)
    q_lens = [chunk] + [1] * decodes
    s_lens = [prefix + chunk] + [dctx] * decodes

    def md(idx):
        starts = [0]
        for i in idx:
            starts.append(starts[-1] + q_lens[i])
        m = PagedAttentionMetadata.build(
            torch.tensor(starts, dtype=torch.int32, device=device),
            torch.tensor([s_lens[i] for i in idx], dtype=torch.int32, device=device),
            p.table[list(idx)].contiguous(),
        )
        q = torch.randn((starts[-1], row["heads"], row["head_size"]), device=device,
                        dtype=p.q.dtype)  # fmt: skip
        return m, q

    out = {"chunk": chunk, "prefix": prefix, "decode_rows": decodes, "decode_ctx": dctx, **row}
    fns = {}
    for name, idx in (
        ("mixed", range(decodes + 1)),
        ("decode_part", range(1, decodes + 1)),
        ("prefill_part", range(1)),
    ):
        m, q = md(idx)
        fns[name] = lambda m=m, q=q: p.new.forward(q, p.cache, m)
    timed = time_providers(fns, time_fn, rounds, interleave, device)
    for name, (med, q25, q75, meds) in timed.items():
        out[name] = {"ms": med, "ms_q25": q25, "ms_q75": q75, "ms_rounds": meds}
    parts = out["decode_part"]["ms"] + out["prefill_part"]["ms"]
    out["mixed_over_parts"] = out["mixed"]["ms"] / parts
    return out


# (BLOCK_M, BLOCK_N, warps, stages, page mode or None) per padded head size: the launch
# settings `sweep` times. Head size 128 holds the settings near the best of the first sweep
# on the H200 (2026-12-02: BLOCK_M 64/128 x BLOCK_N 64/128 x warps 4/8 x stages 2/3/4, page
# mode chosen or 0) plus narrower key tiles; 64 and 256 a ring around today's choice.
SWEEP = {
    64: (
        (128, 64, 4, 3, None),
        (128, 64, 4, 4, None),
        (128, 128, 4, 3, None),
        (128, 128, 8, 3, None),
        (128, 64, 8, 3, None),
        (64, 64, 4, 3, None),
        (128, 32, 4, 3, None),
        (64, 128, 4, 3, None),
    ),
    128: (
        (128, 64, 4, 3, None),
        (128, 64, 8, 3, None),
        (128, 64, 4, 2, None),
        (128, 128, 8, 3, None),
        (64, 64, 4, 2, None),
        (64, 64, 4, 3, None),
        (128, 32, 4, 3, None),
        (64, 32, 4, 3, None),
        (64, 128, 4, 3, None),
    ),
    256: (
        (64, 64, 8, 2, None),
        (64, 64, 4, 2, None),
        (64, 32, 4, 2, None),
        (64, 32, 4, 3, None),
        (128, 64, 8, 2, None),
        (128, 32, 8, 2, None),
        (128, 32, 8, 3, None),
        (64, 64, 8, 3, None),
        (64, 32, 8, 3, None),
        (32, 64, 4, 2, None),
    ),
}
# Issue 29's descriptor candidates: K/V tiles read through tensor descriptors (pages that
# hold whole key tiles) around the shipped choice, the pointer kernel's choice first.
# (BLOCK_M, BLOCK_N, warps, stages, page mode, kv_tma). The sweeps of 2026-12-06 also timed
# 8 warps at head size 128 (slower), 128-key tiles (they spill), Triton's warp
# specialisation and pages of 16 read by four copies per tile (bench/results/
# 2026-12-06-h100-descriptors).
TMA_SWEEP = {
    64: (
        (128, 128, 4, 3, None, False),
        (128, 64, 4, 3, None, True),
        (64, 64, 4, 3, None, True),
        (128, 64, 4, 4, None, True),
    ),
    128: (
        (64, 64, 4, 2, None, False),
        (128, 64, 4, 3, None, True),
        (128, 64, 4, 4, None, True),
        (128, 64, 4, 2, None, True),
        (64, 64, 4, 3, None, True),
    ),
    256: (
        (128, 64, 8, 2, None, False),
        (128, 64, 8, 3, None, True),
        (128, 64, 8, 2, None, True),
        (64, 64, 4, 3, None, True),
    ),
}
TMA_PROBLEMS = (
    (128, 128, 1, 8192),
    (128, 128, 4, 4096),
    (128, 128, 16, 1024),
    (128, 64, 4, 4096),
    (64, 128, 1, 8192),
    (64, 128, 16, 1024),
    (256, 128, 1, 8192),
    (256, 128, 16, 1024),
)
# Packed query heads (a tile's rows as tokens x the kv head's query heads) and the vector
# scan for a tile's sequence, against the shipped pointer and descriptor choices without
# them. (BLOCK_M, BLOCK_N, warps, stages, page mode, kv_tma, pack_gqa, seq_scan);
# descriptor settings are skipped on pages that do not hold whole key tiles.
PACK_SWEEP = {
    64: (
        (128, 128, 4, 3, None, False, False, False),
        (128, 128, 4, 3, None, False, False, True),
        (128, 128, 4, 3, None, False, True, True),
        (128, 64, 4, 3, None, False, True, True),
        (128, 64, 4, 3, None, True, False, False),
        (128, 64, 4, 3, None, True, True, True),
    ),
    128: (
        (64, 64, 4, 2, None, False, False, False),
        (64, 64, 4, 2, None, False, False, True),
        (64, 64, 4, 2, None, False, True, True),
        (128, 64, 4, 2, None, False, True, True),
        (128, 64, 4, 3, None, False, True, True),
        (128, 64, 4, 3, None, True, False, False),
        (128, 64, 4, 3, None, True, False, True),
        (128, 64, 4, 3, None, True, True, True),
    ),
    256: (
        (128, 64, 8, 2, None, False, False, False),
        (128, 64, 8, 2, None, False, False, True),
        (128, 64, 8, 2, None, False, True, True),
        (64, 64, 4, 2, None, False, True, True),
        (128, 64, 8, 3, None, True, False, False),
        (128, 64, 8, 3, None, True, True, True),
    ),
}
PACK_PROBLEMS = (
    (128, 16, 16, 1024),
    (128, 128, 16, 1024),
    (128, 16, 4, 4096),
    (128, 128, 4, 4096),
    (128, 16, 1, 8192),
    (64, 16, 16, 1024),
    (64, 128, 16, 1024),
    (256, 16, 16, 1024),
    (256, 128, 16, 1024),
)
# The output's rows worked out again after the key loop (``late_rows``; on sm_90 the
# 128-row descriptor tile at head size 128 spills 392 bytes without it, 256 with, and
# 700 with a group of 7; head size 64's 128 x 128 pointer tile 336 held, 8 late:
# `bench/prefill_registers.py`) against the shipped launches, on the group of 7 (28/4
# heads) the grid missed and on 32/8 heads. (BLOCK_M, BLOCK_N, warps, stages, page mode,
# kv_tma, pack_gqa, seq_scan, late_rows). The run that adopted it (2026-12-06) also timed
# two layouts for a group of 7 since removed: 16 tokens a 128-row tile, and each token
# padded to 8 rows (``bench/results/2026-12-06-h100-late-rows``).
ROWS_SWEEP = {
    64: (
        (128, 128, 4, 3, None, False, False, True, False),
        (128, 128, 4, 3, None, False, False, True, True),
        (128, 64, 4, 3, None, True, True, True, False),
        (128, 64, 4, 3, None, True, True, True, True),
    ),
    128: (
        (128, 64, 4, 3, None, True, True, True, False),
        (128, 64, 4, 3, None, True, True, True, True),
        (64, 64, 4, 2, None, False, True, True, False),
        (64, 64, 4, 2, None, False, True, True, True),
    ),
    256: (
        (128, 64, 8, 3, None, True, True, True, False),
        (128, 64, 8, 3, None, True, True, True, True),
        (128, 64, 8, 2, None, False, True, True, False),
        (128, 64, 8, 2, None, False, True, True, True),
    ),
}
# (head size, block size, batch, tokens, heads, kv heads)
ROWS_PROBLEMS = (
    (128, 128, 16, 1024, 28, 4),
    (128, 16, 16, 1024, 28, 4),
    (128, 128, 16, 1024, 32, 8),
    (128, 16, 16, 1024, 32, 8),
    (128, 128, 4, 4096, 32, 8),
    (256, 128, 16, 1024, 32, 8),
    (64, 16, 1, 8192, 32, 8),
    (64, 16, 16, 1024, 32, 8),
    (64, 128, 16, 1024, 32, 8),
)
# The five rows that were under SDPA flash (16 x 1024 on pages of 16, head size 128; H100,
# 2026-12-07, interleaved: 0.975-0.999x) read their keys through pointers: that launch and
# the pointer candidates around it with today's packed heads and late rows, none of which
# the earlier sweeps timed together. The 64 x 32 tile on 2 stages, first here, won and is
# today's choice for short contexts (`_triton_prefill.SHORT_CONTEXT`); longer ones keep
# 64 x 64. Same tuple as `ROWS_SWEEP`.
SHORT_SWEEP = {
    128: (
        (64, 32, 4, 2, None, False, True, True, True),
        (64, 64, 4, 2, None, False, True, True, True),
        (64, 64, 4, 3, None, False, True, True, True),
        (64, 64, 8, 2, None, False, True, True, True),
        (64, 32, 4, 3, None, False, True, True, True),
        (32, 64, 4, 2, None, False, True, True, True),
        (128, 64, 8, 2, None, False, True, True, True),
    ),
}
SHORT_PROBLEMS = (
    (128, 16, 16, 1024, 32, 8),
    (128, 16, 16, 1024, 64, 8),
    (128, 16, 16, 1024, 28, 4),
    (128, 16, 4, 4096, 32, 8),
)
# The problems `sweep` times each head size's settings on (32/8 heads, bf16): the issue's
# worst rows (short sequences, head sizes 64 and 256) and one long one.
SWEEP_PROBLEMS = (
    (128, 16, 4, 4096),
    (128, 128, 4, 4096),
    (128, 16, 16, 1024),
    (128, 128, 16, 1024),
    (64, 16, 1, 8192),
    (64, 16, 16, 1024),
    (256, 16, 1, 8192),
    (256, 16, 16, 1024),
    (256, 128, 4, 4096),
)


def sweep(
    device: str,
    time_fn,
    budget_s: float = 1e9,
    quick: bool = False,
    which: str = "launch",
    only: dict | None = None,
) -> list[dict]:
    """The prefill kernel alone under each head size's `SWEEP` settings on `SWEEP_PROBLEMS`
    (head size, block size, batch, tokens), with SDPA flash's time on the same problem and
    the setting `prefill_launch_config` picks today marked. Stops starting problems after
    ``budget_s`` seconds. ``quick``: one tiny problem and two settings (the interpreter).
    ``only``: the problems whose fields (``head_size``, ``block_size``, ``batch``,
    ``tokens``, ``heads``) have these values (strings)."""
    from opcore.attention.backends import _triton_prefill as P
    from opcore.attention.backends.triton_paged import LOG2E

    out = []
    start = time.monotonic()
    table, problems = {
        "tma": (TMA_SWEEP, TMA_PROBLEMS),
        "pack": (PACK_SWEEP, PACK_PROBLEMS),
        "rows": (ROWS_SWEEP, ROWS_PROBLEMS),
        "short": (SHORT_SWEEP, SHORT_PROBLEMS),
    }.get(which, (SWEEP, SWEEP_PROBLEMS))
    if quick:
        problems = ((128, 64, 1, 130),) if which != "launch" else ((64, 16, 1, 130),)
        if which in ("rows", "short"):
            problems = ((128, 64, 1, 130, 6, 2),)
    for hd, bs, b, n, *hk in problems:
        heads, kv = hk or ((4, 2) if quick else (32, 8))
        fields = dict(head_size=hd, block_size=bs, batch=b, tokens=n, heads=heads)
        if any(str(fields.get(k)) != v for k, v in (only or {}).items()):
            continue
        if time.monotonic() - start > budget_s:
            out.append(dict(head_size=hd, block_size=bs, batch=b, tokens=n, heads=heads,
                            kv_heads=kv, error="budget"))  # fmt: skip
            continue
        row = dict(batch=b, q_len=n, ctx=n, heads=heads, kv_heads=kv, head_size=hd,
                   dtype="bfloat16", block_size=bs)  # fmt: skip
        p = Problem(row, device)
        flops = causal_flops(b, n, n, heads, hd)
        ref = p.paged(p.new)().float()
        flash = p.sdpa(gather=False)
        f_med = time_fn(flash)[0] if flash is not None else float("nan")
        d_med = time_fn(p.sdpa(gather=False, backend="default"))[0]
        chosen = P.prefill_launch_config(hd, p.q.dtype, short_context=P.short_context_tiles(hd, n))
        base = dict(head_size=hd, block_size=bs, batch=b, tokens=n, heads=heads, kv_heads=kv,
                    sdpa_flash_tflops=flops / (f_med * 1e-3) / 1e12,
                    sdpa_default_tflops=flops / (d_med * 1e-3) / 1e12)  # fmt: skip
        settings = table[max(64, 1 << (hd - 1).bit_length())]
        settings = settings[:2] if quick else settings
        cfgs = [P.PrefillLaunch(*setting) for setting in settings]
        if chosen not in cfgs:  # today's choice is always timed
            cfgs.insert(0, chosen)
        for cfg in cfgs:
            if cfg.kv_tma and bs % cfg.block_n:
                continue

            def fn(cfg=cfg, p=p, hd=hd, heads=heads, kv=kv):
                P.launch_prefill(
                    query=p.q, key_cache=p.cache[0], value_cache=p.cache[1], out=p.out,
                    metadata=p.metadata, num_heads=heads, num_kv_heads=kv, head_size=hd,
                    qk_scale=p.scale * LOG2E, window=1 << 30, softcap=0.0, causal=True,
                    skip_decode_rows=False, interpret=device != "cuda", launch=cfg,
                )  # fmt: skip
                return p.out

            rec = dict(base, launch=str(cfg), chosen=cfg == chosen)
            try:
                err = float((fn().float() - ref).abs().max())
                med, q25, q75 = time_fn(fn)
            except Exception as exc:  # out of resources, for one
                out.append(dict(rec, error=str(exc)[:200]))
                print(hd, bs, b, n, cfg, "error", str(exc)[:100], flush=True)
                continue
            tf = flops / (med * 1e-3) / 1e12
            out.append(dict(rec, tflops=tf, ms=med, err=err,
                            ratio_vs_flash=tf / base["sdpa_flash_tflops"]))  # fmt: skip
            print(f"h{heads}/{kv} d{hd} bs{bs} {b}x{n} {cfg}"
                  f"{' (chosen)' if rec['chosen'] else ''}: "
                  f"{tf:.0f} TFLOP/s [{flops / (q75 * 1e-3) / 1e12:.0f}-"
                  f"{flops / (q25 * 1e-3) / 1e12:.0f}] flash {base['sdpa_flash_tflops']:.0f} "
                  f"default {base['sdpa_default_tflops']:.0f} "
                  f"err {err:.1e}", flush=True)  # fmt: skip
    return out


def env_line(device: str) -> str:
    import torch
    import triton

    when = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        dev = f"GPU {props.name} ({props.multi_processor_count} SMs)"
    else:
        dev = "CPU (Triton interpreter)"
    return (
        f"date {when}; {dev}; torch {torch.__version__}; triton {triton.__version__}; "
        f"python {sys.version.split()[0]}"
    )


def _cell(rec: dict, name: str) -> str:
    r = rec["providers"][name]
    if r is None:
        return "refused"
    return f"{r['tflops']:.3g} [{r['tflops_q25']:.3g}-{r['tflops_q75']:.3g}]"


def markdown(result: dict) -> str:
    lines = [
        "# Prefill attention: TRITON_PAGED vs SDPA",
        "",
        result["env"],
        "",
        "TFLOP/s (causal part), median [quartiles]; ratio = paged_prefill / sdpa_flash; "
        "vs best = paged_prefill / the fastest dense SDPA form (flash, flash over expanded "
        "K/V, cuDNN, default selection; which one in the best column)."
        + (
            f" Each row's providers timed call by call, {result['interleave']} passes in "
            "shuffled orders, a cache flush before each call: median and quartiles of the "
            "calls."
            if result.get("interleave", 0) > 0
            else f" Each row's providers timed in turn {result['rounds']} times, the order "
            "rotated each round: median and quartiles of the round medians."
            if result.get("rounds", 1) > 1
            else ""
        ),
        "",
        "| batch x q_len / ctx | heads | d | dtype | block | paged_prefill | K/V tiles | "
        "pointers | legacy | sdpa_flash | sdpa_flash_mha | sdpa_gather | sdpa_cudnn | "
        "sdpa_default | ratio | vs best | best | vs pointers | vs legacy | err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['batch']}x{r['q_len']} / {r['ctx']} | {r['heads']}/{r['kv_heads']} | "
            f"{r['head_size']} | {r['dtype']} | {r['block_size']} | {_cell(r, 'paged_prefill')} "
            f"| {'descriptors' if r['kv_descriptors'] else 'pointers'} "
            f"| {_cell(r, 'paged_pointers')} "
            f"| {_cell(r, 'legacy')} | {_cell(r, 'sdpa_flash')} | {_cell(r, 'sdpa_flash_mha')} "
            f"| {_cell(r, 'sdpa_gather')} | {_cell(r, 'sdpa_cudnn')} | "
            f"{_cell(r, 'sdpa_default')} | {r['ratio_vs_flash']:.2f} | "
            f"{r['ratio_vs_best_sdpa']:.2f} | {r['best_sdpa']} | {r['ratio_vs_pointers']:.2f} | "
            f"{r['ratio_vs_legacy']:.2f} | "
            f"{r['paged_prefill_max_abs_err']:.1e} |"
        )
    if result.get("not_measured"):
        lines += ["", f"Not measured (budget spent): {len(result['not_measured'])} rows."]
    m = result.get("mixed")
    if m:
        lines += [
            "",
            f"Mixed batch (chunk {m['chunk']} over {m['prefix']}, {m['decode_rows']} decode "
            f"rows at {m['decode_ctx']}): mixed {m['mixed']['ms']:.3f} ms, decode part "
            f"{m['decode_part']['ms']:.3f} ms, prefill part {m['prefill_part']['ms']:.3f} ms; "
            f"mixed / (decode + prefill) = {m['mixed_over_parts']:.2f}",
        ]
    paths = sorted({r["sdpa_path"] for r in result["rows"]})
    forms = sorted({r["cudnn_form"] for r in result["rows"]})
    lines += ["", f"SDPA path: {'; '.join(paths)}; cuDNN form: {'; '.join(forms)}"]
    return "\n".join(lines) + "\n"


def write_results(result: dict, out: str, pending: list | tuple = ()) -> str:
    """Write ``attention_prefill.json`` and ``.md`` for ``result``; rows in ``pending``
    (not started yet, in a run still going) are listed as not measured. Returns the
    markdown."""
    doc = dict(result, not_measured=[*result["not_measured"], *pending])
    write_json(doc, os.path.join(out, "attention_prefill.json"))
    text = markdown(doc)
    if not doc.get("complete"):
        text += "\nThe run did not finish: the rows above are those measured before it stopped.\n"
    with open(os.path.join(out, "attention_prefill.md"), "w") as f:
        f.write(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the CPU interpreter)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for results")
    ap.add_argument("--rep-ms", type=int, default=50, help="do_bench time per provider")
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop starting rows after")
    ap.add_argument("--limit", type=int, default=0, help="measure at most this many rows")
    ap.add_argument(
        "--only",
        default="",
        help="rows whose fields have these values, e.g. block_size=128,heads=32",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time a row's providers in turn this many times (order rotated each round; "
        "median of the round medians): a drift during the row spreads over all of them",
    )
    ap.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="PASSES",
        help="time the providers call by call instead: PASSES passes, each calling every "
        "provider once in a shuffled order (a GPU's clock follows the previous kernel's "
        "power draw; overrides --rounds)",
    )
    ap.add_argument("--mixed-only", action="store_true", help="only the mixed-batch row")
    ap.add_argument("--sweep", action="store_true", help="only the launch-settings sweep")
    ap.add_argument(
        "--sweep-set",
        choices=("launch", "tma", "pack", "rows", "short"),
        default="launch",
        help="which settings --sweep times (tma: issue 29's descriptor candidates; pack: "
        "packed query heads and the sequence scan; rows: the output's rows after the key "
        "loop; short: pointer launches for 16 x 1024 on pages of 16)",
    )
    args = ap.parse_args(argv)
    if args.quick and "TRITON_INTERPRET" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"  # before Triton's first import
    device = _device()
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("no GPU: run with --quick (Triton's interpreter)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    time_fn = timer(device, args.rep_ms)
    only = {}
    for pair in filter(None, args.only.split(",")):
        field, _, value = pair.partition("=")
        only[field.strip()] = value.strip()
    if args.sweep:
        records = sweep(device, time_fn, args.budget_s, args.quick, args.sweep_set, only)
        write_json(
            {"env": env_line(device), "sweep": records},
            os.path.join(args.out, "attention_prefill_sweep.json"),
        )
        return 0
    start = time.monotonic()
    rows = grid(args.quick)
    for field, value in only.items():
        rows = [r for r in rows if str(r.get(field)) == value]
    if args.limit:
        rows = rows[: args.limit]
    if args.mixed_only:
        rows = []
    result = {
        "env": env_line(device),
        "rounds": args.rounds,
        "interleave": args.interleave,
        "rows": [],
        "not_measured": [],
        "complete": False,
    }
    print(result["env"], flush=True)
    for i, row in enumerate(rows):
        if time.monotonic() - start > args.budget_s:
            result["not_measured"].append(row)
            continue
        rec = measure_row(row, device, time_fn, args.rounds, args.interleave)
        result["rows"].append(rec)
        # Written after every row: a run stopped from outside keeps what it measured.
        write_results(result, args.out, rows[i + 1 :])
        print(
            f"{row['batch']}x{row['q_len']}/{row['ctx']} h{row['heads']}/{row['kv_heads']} "
            f"d{row['head_size']} {row['dtype']} bs{row['block_size']}: "
            + ", ".join(f"{k} {_cell(rec, k)}" for k in PROVIDERS)
            + f"; ratio {rec['ratio_vs_flash']:.2f}, err {rec['paged_prefill_max_abs_err']:.1e}",
            flush=True,
        )
    if time.monotonic() - start <= args.budget_s + 30 or args.quick:
        result["mixed"] = measure_mixed(device, time_fn, args.quick, args.rounds, args.interleave)
        print(f"mixed: {json.dumps(result['mixed'])}", flush=True)
    result["elapsed_s"] = time.monotonic() - start
    result["complete"] = True
    print(write_results(result, args.out))
    worst = max((r["paged_prefill_max_abs_err"] for r in result["rows"]), default=0.0)
    # A wrong result fails the run (bf16 outputs of unit-variance inputs: well under 0.1).
    return 0 if math.isfinite(worst) and worst < 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
