"""``TRITON_PAGED``'s per-call path (docs/attention.md#per-batch-cache): what a forward
decides once per batch, and the launches it binds once per call signature.

A forward of a batch seen before, with tensors laid out as before, does three lookups and
one replay:

1. the batch's `Plan`, cached on the metadata (`PagedAttentionMetadata.checked_cache`)
   under ``(backend class, settings, kv_cache.shape, query tokens, device)``: made once,
   after every check of the batch against that cache passed (`check_cache`), holding what
   the batch's host values decide (kernel path, sequence count, split count, grid, the
   prefill kernel's tiles);
2. plans are interned by value, so every batch with the same decisions shares one `Plan`
   object, and a backend's replays are keyed by ``(plan, call_signature)``;
3. the replay (`opcore.kernels.triton._bound.binder` over the backend's launch function)
   allocates the outputs and launches the compiled kernels with the call's tensors, the
   block table and lengths included: no value of a batch is baked into a replay beyond the
   plan, which is part of its key.

Everything a launch bakes in (constexprs, strides, block size, window, scale, launch
options, the binary Triton specialised for the dtypes and 16-byte alignments) is a
function of the settings (in the plan), the plan and the call signature, so a replay is
never reused for another shape, dtype, layout, alignment, device or split count.
"""

from __future__ import annotations

import threading
from typing import Any

# Most interned plans and most replays a backend instance keeps, before starting over
# (each is remade once on its next use).
MAX_PLANS = 1024
MAX_REPLAYS = 256

# Plan kinds: which kernels a batch runs. Only the kinds whose every launch goes through
# `_bound.launch` are bound (a launch made another way would be missing from a replay).
EMPTY, DECODE, MIXED, PREFILL, LEGACY = "empty", "decode", "mixed", "prefill", "legacy"
BINDABLE = frozenset({DECODE, MIXED, PREFILL, LEGACY})

_plans: dict[tuple, Plan] = {}
_lock = threading.Lock()


class Plan:
    """What a batch's host values decide for one backend setting and cache geometry;
    compared by identity (one object per value, `intern`)."""

    __slots__ = (
        "value", "kind", "num_seqs", "splits", "max_query_len", "short_context", "bindable"
    )  # fmt: skip

    def __init__(self, value: tuple) -> None:
        self.value = value
        _, self.kind, self.num_seqs, self.splits, self.max_query_len, self.short_context = value
        self.bindable = self.kind in BINDABLE

    def __repr__(self) -> str:
        return (
            f"Plan({self.kind}, num_seqs={self.num_seqs}, splits={self.splits}, "
            f"max_query_len={self.max_query_len}, short_context={self.short_context})"
        )


def intern(
    settings: tuple,
    kind: str,
    num_seqs: int,
    splits: int,
    max_query_len: int,
    short_context: bool = False,
) -> Plan:
    """The one `Plan` of these values (``splits`` 0 where no decode kernel runs,
    ``max_query_len`` 0 where no launch reads it, ``short_context``: the prefill kernel's
    short-context tiles, `_triton_prefill.short_context_tiles`)."""
    value = (settings, kind, num_seqs, splits, max_query_len, short_context)
    plan = _plans.get(value)
    if plan is None:
        with _lock:
            if len(_plans) >= MAX_PLANS:
                _plans.clear()
            plan = _plans.setdefault(value, Plan(value))
    return plan


def call_signature(kv_cache: Any, query: Any, out: Any, metadata: Any) -> tuple:
    """Per tensor a launch reads (the cache, query, output, and the batch's
    ``query_start_loc``, ``seq_lens``, ``block_table``): dtype, shape, strides, data
    pointer modulo 16 and device index. One flat tuple: this runs on every call."""
    qsl, lens, table = metadata.query_start_loc, metadata.seq_lens, metadata.block_table
    return (
        kv_cache.dtype, kv_cache.shape, kv_cache.stride(), kv_cache.data_ptr() & 15,
        kv_cache.get_device(),
        query.dtype, query.shape, query.stride(), query.data_ptr() & 15, query.get_device(),
        None if out is None else
        (out.dtype, out.shape, out.stride(), out.data_ptr() & 15, out.get_device()),
        qsl.dtype, qsl.shape, qsl.stride(), qsl.data_ptr() & 15, qsl.get_device(),
        lens.dtype, lens.shape, lens.stride(), lens.data_ptr() & 15, lens.get_device(),
        table.dtype, table.shape, table.stride(), table.data_ptr() & 15, table.get_device(),
    )  # fmt: skip


def remember(replays: dict, key: tuple, replay: Any) -> None:
    """``replays[key] = replay``, starting over past `MAX_REPLAYS`."""
    if len(replays) >= MAX_REPLAYS:
        replays.clear()
    replays[key] = replay
