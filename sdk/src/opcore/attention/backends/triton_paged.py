"""``TRITON_PAGED``: paged attention in Triton, a core backend: it names no vendor, and runs
on the device types Triton compiles for (`supported_device_types`; the CPU under
``TRITON_INTERPRET=1``). Platforms whose devices Triton drives list it as a candidate.

This module imports without Triton; the kernels (`_triton_kernels`) are imported on first
use, and `unavailable_reason` says why the backend cannot run when Triton is missing.

Dispatch: a batch whose sequences all bring at most one new token runs the split-KV
decode kernel (plus a merge kernel when it splits). Any other batch runs the paged prefill
kernel (`_triton_prefill`: 128-row query tiles, whole pages per key tile) over its
sequences with more than one new token; in a mixed batch the decode rows go to the decode
kernel first (launched over the batch, skipping the others on the device), so a mixed batch
costs its decode part plus its prefill part. ``prefill_path = "legacy"`` (for
bench/attention_prefill.py) runs the earlier mixed kernel instead. The number of KV splits
is chosen so that
``num_seqs * num_kv_heads * splits`` gives each multiprocessor about
``decode_programs_per_sm`` programs, each split keeping at least four tiles of keys.

The per-call path (`_triton_paged_plan`, docs/attention.md#per-batch-cache): a forward
checks a batch once and caches its plan (kernel path, split count) on the metadata; the
launches of a plan and call signature are recorded once (`opcore.kernels.triton._bound`)
and replayed through the compiled kernels' launchers with the call's tensors.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from opcore.attention.backend import AttentionBackend, MultipleOf
from opcore.attention.backends import _triton_paged_plan as _plan
from opcore.attention.paged import PagedAttentionMetadata, check_qkv
from opcore.kernels import TRITON_BACKEND_DEVICE_TYPES
from opcore.platforms import get_current_platform

LOG2E = 1.4426950408889634


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


@functools.cache
def _kernels():
    from opcore.attention.backends import _triton_kernels

    return _triton_kernels


@functools.cache
def _prefill():
    from opcore.attention.backends import _triton_prefill

    return _triton_prefill


@functools.cache
def _bound():
    # Imported with the kernels, on first use (it needs Triton's launcher).
    from opcore.kernels.triton import _bound

    return _bound


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache
def _multiprocessors(device_type: str, index: int) -> int:
    if _interpreting():
        return 4
    props = getattr(torch, device_type).get_device_properties(index)
    return int(
        getattr(props, "multi_processor_count", 0) or getattr(props, "gpu_subslice_count", 0) or 64
    )


@functools.cache
def _descriptor_copies(platform, index: int) -> bool:
    """``platform.tensor_descriptor_copies(index)``, asked once per platform and device."""
    return bool(platform.tensor_descriptor_copies(index))


class TritonPagedBackend(AttentionBackend):
    name = "TRITON_PAGED"
    supported_dtypes = (torch.float16, torch.bfloat16)
    supported_kv_cache_dtypes = ("auto",)
    # Any size works (the head dimension is padded to a power of two and masked); these
    # are the sizes models use and the suite checks.
    supported_head_sizes = (32, 64, 80, 96, 112, 128, 160, 192, 256)
    # Keys are gathered one position at a time through the block table: any page size.
    supported_block_sizes = (MultipleOf(1),)
    # Device types Triton compiles for ("cuda" is also ROCm's torch device type).
    supported_device_types = tuple(sorted(set(TRITON_BACKEND_DEVICE_TYPES.values())))
    supports_gqa = True
    supports_mqa = True
    supports_sliding_window = True
    supports_causal = True
    supports_non_causal = True
    supports_logits_soft_cap = True

    # Tuning knobs (see bench/results/attention-h200.md for how they were chosen).
    decode_block_n = 64
    decode_num_warps = 4
    decode_num_stages = 2
    prefill_block_n = 64
    prefill_block_m = 64
    prefill_num_warps = 4
    prefill_num_stages = 2
    # "paged_prefill": `_triton_prefill` (launch settings: its prefill_launch_config);
    # "legacy": the earlier mixed kernel above (prefill_block_*), kept for the benchmark.
    prefill_path = "paged_prefill"
    # Read prefill key tiles through tensor descriptors where a page holds whole tiles
    # (`_triton_prefill.prefill_launch_config`): None asks the platform for the query's
    # device (`kv_descriptors_on`); a bool forces it.
    prefill_kv_descriptors: bool | None = None
    # None: choose from the device's multiprocessor count; an int forces it.
    num_splits: int | None = None
    # docs/properties.md. No atomics, no host synchronization in forward (the metadata's
    # host copies are made when it is built). Batch-invariant only with a fixed split
    # count: chosen from the number of sequences, a sequence's keys are split (and the
    # partial results merged) differently alone than in a larger batch; with it the
    # prefill kernel's key tiles stop following the batch's longest context too.
    properties = frozenset({"deterministic", "capture_safe"})
    # The fixed split count used where a config requires batch_invariant.
    batch_invariant_splits = 4
    # Aim for this many decode programs per multiprocessor (several resident programs
    # per SM hide memory latency and shorten the tail of the last wave).
    decode_programs_per_sm = 4

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # (plan, call signature) -> the bound launch serving it; the binder, made on first use.
        self._replays: dict = {}
        self._bind = None
        if self.num_splits is None:
            from opcore.settings import get_current_config

            # A config requiring batch_invariant (OPCORE_BATCH_INVARIANT=1) gets the
            # fixed split count, decided once here rather than per forward.
            if "batch_invariant" in get_current_config().kernel.required_properties:
                self.num_splits = self.batch_invariant_splits

    def kv_descriptors_on(self, device: torch.device) -> bool:
        """Whether prefill reads key tiles through tensor descriptors on ``device``: the
        forced `prefill_kv_descriptors`, else what the platform says of that device
        (`Platform.tensor_descriptor_copies`, asked once per device: a host may mix GPU
        generations)."""
        if self.prefill_kv_descriptors is not None:
            return bool(self.prefill_kv_descriptors)
        return _descriptor_copies(get_current_platform(), device.index or 0)

    def declared_properties(self) -> frozenset[str]:
        if self.num_splits is not None:
            return self.properties | {"batch_invariant"}
        return self.properties

    @classmethod
    def property_variants(cls) -> dict[str, dict[str, object]]:
        return {
            "splits_auto": {"num_splits": None},
            f"splits_{cls.batch_invariant_splits}": {"num_splits": cls.batch_invariant_splits},
        }

    @classmethod
    def unavailable_reason(cls, device_type: str | None) -> str | None:
        try:
            found = importlib.util.find_spec("triton") is not None
        except (ImportError, ValueError):
            found = False
        return None if found else "triton is not installed"

    @classmethod
    def validate_configuration(cls, cfg) -> list[str]:
        reasons = super().validate_configuration(cfg)
        if cfg.device_type == "cpu" and _interpreting():
            # The interpreter runs the kernels on the host: drop the device-type reason.
            reasons = [r for r in reasons if not r.startswith("device type")]
        return reasons

    # ------------------------------------------------------------------ write
    def write_kv(self, key, value, kv_cache, slot_mapping) -> None:
        key_cache, value_cache = self.check_write_kv(key, value, kv_cache, slot_mapping)
        if key.shape[0] == 0:
            return
        for arg, t in (("key", key), ("value", value), ("kv_cache", key_cache)):
            if t.stride(-1) != 1:
                raise ValueError(f"{self.name}: {arg} must be contiguous in head_size")
        k = _kernels()
        k.write_kv_kernel[(key.shape[0],)](
            key,
            value,
            key_cache,
            value_cache,
            slot_mapping.to(torch.int64),
            key.stride(0),
            key.stride(1),
            value.stride(0),
            value.stride(1),
            key_cache.stride(0),
            key_cache.stride(1),
            key_cache.stride(2),
            value_cache.stride(0),
            value_cache.stride(1),
            value_cache.stride(2),
            NUM_KV_HEADS=self.num_kv_heads,
            HEAD=self.head_size,
            HEADS_PAD=_pow2(self.num_kv_heads),
            HEAD_PAD=_pow2(self.head_size),
            block_size=key_cache.shape[1],
        )

    # ------------------------------------------------------------------ forward
    def _settings(self) -> tuple:
        """Every setting `_make_plan` and `_launch` read: part of each plan's value, so a
        changed setting makes new plans and new bindings."""
        return (
            self.num_heads, self.num_kv_heads, self.head_size, self.scale, self.sliding_window,
            self.logits_soft_cap, self.causal, self.num_splits, self.decode_block_n,
            self.decode_num_warps, self.decode_num_stages, self.decode_programs_per_sm,
            self.prefill_path, self.prefill_block_n, self.prefill_block_m,
            self.prefill_num_warps, self.prefill_num_stages, self.prefill_kv_descriptors,
        )  # fmt: skip

    def forward(self, query, kv_cache, metadata: PagedAttentionMetadata, out=None) -> torch.Tensor:
        # The per-call path (`_triton_paged_plan`): this batch's plan for these settings and
        # this cache, then the replay bound for this plan and these tensors. A plan means
        # every check of the batch passed; a replay, that this signature's checks did.
        settings = self._settings()
        try:
            plan = metadata.checked_cache().get(
                (type(self), settings, kv_cache.shape, query.shape[0], query.device)
            )
            replay = (
                None
                if plan is None
                else self._replays.get((plan, _plan.call_signature(kv_cache, query, out, metadata)))
            )
        except (AttributeError, TypeError):  # not tensors: the full path says what is wrong
            replay = None
        if replay is None:
            return self._forward_full(query, kv_cache, metadata, out, settings)
        return replay(
            kv_cache,
            query,
            out,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_table,
            metadata,
            plan,
        )

    def _forward_full(self, query, kv_cache, metadata, out, settings) -> torch.Tensor:
        """Check the call, find or make the batch's plan, then replay the launches bound
        for it and these tensors, or run them (binding them where the plan allows)."""
        check_qkv(self.name, self.num_heads, self.num_kv_heads, self.head_size, query=query)
        if query.shape[0] != metadata.num_tokens:
            raise ValueError(
                f"{self.name}: query has {query.shape[0]} tokens but query_start_loc[-1] is "
                f"{metadata.num_tokens}"
            )
        if query.stride(-1) != 1:
            raise ValueError(f"{self.name}: query must be contiguous in head_size")
        key_cache, _ = self.split_kv_cache(kv_cache)
        if key_cache.dtype != query.dtype:
            raise ValueError(
                f"{self.name}: query dtype {query.dtype} differs from kv_cache dtype "
                f"{key_cache.dtype}"
            )
        if out is not None:
            self._check_out(query, out)
        derived = metadata.checked_cache()
        plan_key = (type(self), settings, kv_cache.shape, query.shape[0], query.device)
        plan = derived.get(plan_key)
        if plan is None:
            metadata.check_cache(key_cache.shape[0], key_cache.shape[1])
            plan = derived[plan_key] = self._make_plan(settings, query.device, metadata)
        if plan.kind == _plan.EMPTY:
            return torch.empty_like(query) if out is None else out
        args = (
            kv_cache,
            query,
            out,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_table,
            metadata,
            plan,
        )
        # An output that is the query would be taken for it in the recording (a replay
        # would then return the query even when given another output): not bound.
        if not plan.bindable or out is query:
            return self._launch(*args)
        key = (plan, _plan.call_signature(kv_cache, query, out, metadata))
        replay = self._replays.get(key)
        if replay is not None:  # a new batch of a plan and signature bound before
            return replay(*args)
        bind = self._bind
        if bind is None:
            bind = self._bind = _bound().binder(self._launch)
        result, replay = bind(*args)
        if replay is not None:
            _plan.remember(self._replays, key, replay)
        return result

    def _check_out(self, query, out) -> None:
        if (
            not isinstance(out, torch.Tensor)
            or out.shape != query.shape
            or out.dtype != query.dtype
            or out.device != query.device
            or out.stride(-1) != 1
        ):
            got = (
                f"{tuple(out.shape)} {out.dtype} on {out.device}, strides {out.stride()}"
                if isinstance(out, torch.Tensor)
                else type(out).__name__
            )
            raise ValueError(
                f"{self.name}: out must be a tensor like the query ({tuple(query.shape)} "
                f"{query.dtype} on {query.device}, contiguous in head_size), got {got}"
            )

    def _make_plan(self, settings: tuple, device: torch.device, metadata) -> _plan.Plan:
        """What this batch's host values decide: the kernel path, the split count."""
        num_seqs = metadata.num_seqs
        if metadata.num_tokens == 0:
            return _plan.intern(settings, _plan.EMPTY, num_seqs, 0, 0)
        if metadata.max_query_len <= 1:
            splits = self._choose_splits(device, num_seqs, metadata.max_seq_len)
            return _plan.intern(settings, _plan.DECODE, num_seqs, splits, 0)
        if self.prefill_path == "legacy":
            return _plan.intern(settings, _plan.LEGACY, num_seqs, 0, metadata.max_query_len)
        # The prefill kernel's short-context tiles follow the batch's longest context, so
        # only where the backend does not promise batch invariance.
        short = "batch_invariant" not in self.declared_properties() and (
            _prefill().short_context_tiles(self.head_size, metadata.max_seq_len)
        )
        if metadata.num_decode_seqs > 0:
            # A mixed batch: its decode rows in the decode kernel, the rest in the prefill
            # kernel; the split count sized for the decode rows.
            splits = self._choose_splits(device, metadata.num_decode_seqs, metadata.max_seq_len)
            return _plan.intern(settings, _plan.MIXED, num_seqs, splits, 0, short)
        return _plan.intern(settings, _plan.PREFILL, num_seqs, 0, 0, short)

    def _launch(
        self, kv_cache, query, out, query_start_loc, seq_lens, block_table, metadata, plan
    ) -> torch.Tensor:
        """Allocate and launch ``plan``'s kernels over the call's tensors, through `_bound`
        (a bind records them). It reads nothing of the batch but its tensors and the plan,
        so a replay serves other batches of the same plan: the prefill kernel's launcher
        takes ``metadata`` for the same three tensors and for the token and sequence
        counts, which the plan and its key hold."""
        b = _bound()
        key_cache, value_cache = self.split_kv_cache(kv_cache)
        if out is None:
            out = b.empty(query.shape, query.dtype, query.device)
        block_size = key_cache.shape[1]
        group = self.num_heads // self.num_kv_heads
        head_pad = max(16, _pow2(self.head_size))
        common = dict(
            SOFTCAP=float(self.logits_soft_cap or 0.0),
            HEAD=self.head_size,
            HEAD_PAD=head_pad,
            INTERPRET=_interpreting(),
        )
        strides = (
            query.stride(0),
            query.stride(1),
            out.stride(0),
            out.stride(1),
            key_cache.stride(0),
            key_cache.stride(1),
            key_cache.stride(2),
            value_cache.stride(0),
            value_cache.stride(1),
            value_cache.stride(2),
            block_table.stride(0),
        )
        # Block size and window are runtime arguments so one compiled kernel serves every
        # page size; "no window" is a window longer than any context.
        window = self.sliding_window or (1 << 30)
        qk_scale = self.scale * LOG2E
        k = _kernels()
        num_seqs = plan.num_seqs
        mixed = plan.kind == _plan.MIXED
        if plan.kind in (_plan.DECODE, _plan.MIXED):
            splits = plan.splits
            if splits > 1:
                part_acc = b.empty(
                    (num_seqs, self.num_heads, splits, head_pad), torch.float32, query.device
                )
                part_ml = b.empty(
                    (num_seqs, self.num_heads, splits, 2), torch.float32, query.device
                )
            else:
                part_acc = part_ml = out  # unused by the kernel when it does not split
            pa = part_acc.stride()[:3] if splits > 1 else (0, 0, 0)
            pm = part_ml.stride()[:2] if splits > 1 else (0, 0)
            b.launch(
                k.paged_decode_kernel,
                (num_seqs, self.num_kv_heads, splits),
                query,
                key_cache,
                value_cache,
                out,
                part_acc,
                part_ml,
                query_start_loc,
                seq_lens,
                block_table,
                qk_scale,
                *strides,
                *pa,
                *pm,
                block_size,
                window,
                splits,
                GROUP=group,
                BLOCK_H=max(16, _pow2(group)),
                BLOCK_N=self.decode_block_n,
                SPLIT=splits > 1,
                DECODE_ROWS_ONLY=mixed,
                num_warps=self.decode_num_warps,
                num_stages=self.decode_num_stages,
                **common,
            )
            if splits > 1:
                b.launch(
                    k.paged_decode_reduce_kernel,
                    (num_seqs, self.num_heads),
                    out,
                    part_acc,
                    part_ml,
                    query_start_loc,
                    out.stride(0),
                    out.stride(1),
                    *pa,
                    *pm,
                    splits,
                    HEAD=self.head_size,
                    HEAD_PAD=head_pad,
                    SPLITS_PAD=max(2, _pow2(splits)),
                    DECODE_ROWS_ONLY=mixed,
                )
            if not mixed:
                return out
        if plan.kind != _plan.LEGACY:
            _prefill().launch_prefill(
                query=query,
                key_cache=key_cache,
                value_cache=value_cache,
                out=out,
                metadata=metadata,
                num_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads,
                head_size=self.head_size,
                qk_scale=qk_scale,
                window=window,
                softcap=common["SOFTCAP"],
                causal=self.causal,
                skip_decode_rows=mixed,
                interpret=common["INTERPRET"],
                kv_descriptors=self.kv_descriptors_on(query.device),
                short_context=plan.short_context,
            )
            return out
        group_pad = _pow2(group)
        # BLOCK_Q query tokens x the padded GQA group fill the M dimension (tl.dot needs
        # M >= 16).
        block_q = max(1, self.prefill_block_m // group_pad, -(-16 // group_pad))
        grid = (num_seqs, -(-plan.max_query_len // block_q), self.num_kv_heads)
        b.launch(
            k.paged_attention_kernel,
            grid,
            query,
            key_cache,
            value_cache,
            out,
            query_start_loc,
            seq_lens,
            block_table,
            qk_scale,
            *strides,
            block_size,
            window,
            GROUP=group,
            GROUP_PAD=group_pad,
            BLOCK_Q=block_q,
            BLOCK_N=self.prefill_block_n,
            CAUSAL=self.causal,
            num_warps=self.prefill_num_warps,
            num_stages=self.prefill_num_stages,
            **common,
        )
        return out

    def _choose_splits(self, device: torch.device, num_seqs: int, max_seq_len: int) -> int:
        if self.num_splits is not None:
            return max(1, int(self.num_splits))
        sms = _multiprocessors(device.type, device.index or 0)
        programs = num_seqs * self.num_kv_heads
        # Rounded to nearest, not up: on an H200 one split of 512 programs (3.9 per SM) beat
        # two splits of 1024, and 8 splits of 64 programs beat 5 (bench/results).
        want = round(self.decode_programs_per_sm * sms / max(1, programs))
        # Each split should still stream at least a few tiles.
        most = max(1, max_seq_len // (4 * self.decode_block_n))
        return max(1, min(want, most, 64))
