"""Decode-attention benchmark records, for ``bench/attention_decode.py`` and `opcore bench`.

`decode_attention_records` times one backend's decode call (one new token per sequence,
every sequence's blocks scattered at random over a paged cache) over a grid of batch sizes
and context lengths, and compares it with `torch.nn.functional.scaled_dot_product_attention`
on the same keys and values:

- ``sdpa_dense_us``: SDPA on KV already gathered into contiguous ``[batch, kv_heads,
  context, head_size]`` tensors, the query's GQA group as its query length (exact for
  decode). The best case for a dense kernel: no paging at all.
- ``sdpa_gather_us``: the gather from the paged cache plus that SDPA call.

``kv_bytes`` is the least a decode step must read: every sequence's keys and values once
(``batch x context x kv_heads x head_size x 2 x element size``); query and output are
negligible beside it. ``gbs`` is ``kv_bytes`` over the CUDA-graph time (device time,
launch gaps removed) where the platform has graphs (`Platform.capture_graph`), else over
the eager time; ``pct_copy`` compares it with a measured device-to-device copy rate when
one is given. On a device without timing events (`Platform.timing_event`) the host clock
times each call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from opcore.attention.paged import PagedAttentionMetadata

if TYPE_CHECKING:
    from opcore.attention.backend import AttentionBackend

BATCHES = (1, 8, 32, 64, 128, 256)
CONTEXTS = (1024, 4096, 16384, 32768)
QUICK_BATCHES = (1, 4)
QUICK_CONTEXTS = (256, 1024)


def build_decode_batch(
    batch: int,
    context: int,
    *,
    kv_heads: int,
    heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    backend_cls: type[AttentionBackend],
    generator: torch.Generator | None = None,
):
    """A random cache (the backend's layout), a block table scattering each sequence's
    blocks over it, one query token per sequence, and the metadata."""
    blocks_per_seq = math.ceil(context / block_size)
    num_blocks = batch * blocks_per_seq
    cache = backend_cls.allocate_kv_cache(
        num_blocks, block_size, kv_heads, head_size, dtype, device
    )
    cache.normal_(generator=generator)
    table = (
        torch.randperm(num_blocks, device=device, generator=generator)
        .to(torch.int32)
        .view(batch, blocks_per_seq)
    )
    query = torch.randn((batch, heads, head_size), device=device, dtype=dtype, generator=generator)
    metadata = PagedAttentionMetadata.build(
        torch.arange(batch + 1, device=device, dtype=torch.int32),
        torch.full((batch,), context, device=device, dtype=torch.int32),
        table,
    )
    return cache, table, query, metadata


def decode_attention_records(
    batches: Iterable[int] = BATCHES,
    contexts: Iterable[int] = CONTEXTS,
    *,
    backend: str = "TRITON_PAGED",
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    heads: int = 32,
    kv_heads: int = 8,
    head_size: int = 128,
    block_size: int = 16,
    copy_gbs: float | None = None,
    rep_ms: int = 50,
    log=None,
    platform: Any | None = None,
) -> list[dict[str, Any]]:
    """One record per (batch, context); see the module docstring. A shape that fails
    (out of memory, say) gives a record with ``error`` instead of timings. ``platform``
    (default: the current one) supplies the timers, synchronisation and cache release."""
    from opcore.attention.selector import backend_class
    from opcore.attention.selector_config import AttentionSelectorConfig
    from opcore.bench import timing

    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    device = platform.device() if device is None else torch.device(device)
    timers = timing.timers(platform, device)
    cfg = AttentionSelectorConfig(
        head_size=head_size,
        num_heads=heads,
        num_kv_heads=kv_heads,
        dtype=dtype,
        block_size=block_size,
        device_type=device.type,
    )
    cls = backend_class(backend)
    reasons = cls.validate_configuration(cfg)
    if reasons:
        raise ValueError(
            f"{backend} cannot run the decode benchmark on {device.type}: {'; '.join(reasons)}"
        )
    impl = cls(heads, head_size, kv_heads, head_size**-0.5)
    records = []
    for context in contexts:
        for batch in batches:
            record: dict[str, Any] = {
                "op": "decode_attention",
                "provider": backend,
                "batch": batch,
                "context": context,
                "heads": heads,
                "kv_heads": kv_heads,
                "head_size": head_size,
                "block_size": block_size,
                "dtype": str(dtype).removeprefix("torch."),
            }
            try:
                record.update(
                    _measure(impl, cls, batch, context, cfg, device, copy_gbs, rep_ms,
                             platform, timers)
                )  # fmt: skip
            except Exception as exc:  # one shape's failure must not lose the others
                record["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            if device.type == platform.device_type:
                platform.empty_cache()
            if log is not None:
                log(format_record(record))
            records.append(record)
    return records


def _measure(
    impl, cls, batch, context, cfg, device, copy_gbs, rep_ms, platform, timers
) -> dict[str, Any]:
    from opcore.bench import timing

    cache, table, query, md = build_decode_batch(
        batch,
        context,
        kv_heads=cfg.num_kv_heads,
        heads=cfg.num_heads,
        head_size=cfg.head_size,
        block_size=cfg.block_size,
        dtype=cfg.dtype,
        device=device,
        backend_cls=cls,
    )
    kv_bytes = 2 * batch * context * cfg.num_kv_heads * cfg.head_size * cache.element_size()
    out = impl.forward(query, cache, md)
    key_cache, value_cache = impl.split_kv_cache(cache)
    idx = table.long()
    group = cfg.num_heads // cfg.num_kv_heads

    def gather():
        k = (
            key_cache[idx]
            .view(batch, -1, cfg.num_kv_heads, cfg.head_size)[:, :context]
            .transpose(1, 2)
        )
        v = (
            value_cache[idx]
            .view(batch, -1, cfg.num_kv_heads, cfg.head_size)[:, :context]
            .transpose(1, 2)
        )
        return k, v

    qg = query.view(batch, cfg.num_kv_heads, group, cfg.head_size)
    k, v = (t.contiguous() for t in gather())
    ref = F.scaled_dot_product_attention(qg, k, v).reshape(batch, cfg.num_heads, cfg.head_size)
    rec: dict[str, Any] = {
        "kv_bytes": kv_bytes,
        "max_abs_err_vs_sdpa": float((out.float() - ref.float()).abs().max()),
    }
    if timers == "device":

        def dev(fn):
            return timing.device_median_us(fn, platform, rep_ms=rep_ms)

        rec["us"] = dev(lambda: impl.forward(query, cache, md))
        graph_us = timing.graph_median_us(
            lambda: impl.forward(query, cache, md), platform, rep_ms=rep_ms, estimate_us=rec["us"]
        )
        if graph_us is not None:
            rec["graph_us"] = graph_us
        rec["sdpa_dense_us"] = dev(lambda: F.scaled_dot_product_attention(qg, k, v))
        k = v = None  # free the dense copies before timing gather + SDPA
        rec["sdpa_gather_us"] = dev(lambda: F.scaled_dot_product_attention(qg, *gather()))
        device_us = rec.get("graph_us", rec["us"])
    else:
        sync = platform.synchronize if device.type == platform.device_type else None

        def host(fn):
            return timing.host_median_us(fn, synchronize=sync)

        rec["us"] = host(lambda: impl.forward(query, cache, md))
        rec["sdpa_dense_us"] = host(lambda: F.scaled_dot_product_attention(qg, k, v))
        rec["sdpa_gather_us"] = host(lambda: F.scaled_dot_product_attention(qg, *gather()))
        device_us = rec["us"]
    rec["gbs"] = kv_bytes / (device_us * 1e-6) / 1e9
    if copy_gbs:
        rec["pct_copy"] = 100 * rec["gbs"] / copy_gbs
    splits = getattr(impl, "_choose_splits", None)
    if splits is not None and device.type != "cpu":
        rec["kv_splits"] = splits(device, batch, context)
    return rec


def format_record(r: dict[str, Any]) -> str:
    head = f"{r['provider']} B={r['batch']:4d} ctx={r['context']:6d}"
    if "error" in r:
        return f"{head}: {r['error']}"
    parts = [f"KV {r['kv_bytes'] / 2**20:9.1f} MiB", f"eager {r['us']:9.1f} us"]
    if "graph_us" in r:
        parts.append(f"graph {r['graph_us']:9.1f} us")
    parts.append(f"{r['gbs'] / 1000:5.2f} TB/s")
    if "pct_copy" in r:
        parts.append(f"{r['pct_copy']:5.1f}% of copy")
    if "kv_splits" in r:
        parts.append(f"splits {r['kv_splits']:2d}")
    parts.append(
        f"sdpa dense {r['sdpa_dense_us']:9.1f} us, gather+sdpa {r['sdpa_gather_us']:9.1f} us"
    )
    parts.append(f"err {r['max_abs_err_vs_sdpa']:.1e}")
    return head + "  " + " | ".join(parts)
