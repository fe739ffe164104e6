"""``TRITON_PAGED``'s per-call path (docs/attention.md#per-batch-cache): the batch's plan
cached on its metadata, the launches bound per call signature and replayed through
`opcore.kernels.triton._bound`.

The metadata's own rules (frozen fields, in-place writes seen through torch's version
counters) are checked here with ``TORCH_NATIVE``; the Triton kernels run in a child under
Triton's interpreter, where a replay calls the interpreted kernel with the call's tensors
(the same recording logic as on a GPU). Calls are told apart by counting, on a real
backend, its ``_forward_full`` calls (the checks: once per batch and signature) and its
``_launch`` calls (a run that is not a replay: a recording, or an unbound kind).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from opcore.attention import PagedAttentionMetadata
from opcore.attention.backends.torch_native import TorchNativeBackend
from opcore.testing.interpreter import UNDER_TRITON_INTERPRETER, rerun_under_triton_interpreter

HEADS, KV_HEADS, HEAD, BLOCK, NUM_BLOCKS = 4, 2, 32, 16, 40


def _metadata(lens, query_lens=None, *, seed=0, width=None):
    """A batch over a cache of `NUM_BLOCKS` blocks: sequence ``i`` of ``lens[i]`` tokens
    (``query_lens[i]`` of them new; 1 each by default) in blocks drawn at random."""
    g = torch.Generator().manual_seed(seed)
    query_lens = query_lens or [1] * len(lens)
    width = width or max(-(-n // BLOCK) for n in lens)
    table = torch.randperm(NUM_BLOCKS, generator=g)[: len(lens) * width].view(len(lens), width)
    starts = torch.tensor([0, *query_lens]).cumsum(0)
    return PagedAttentionMetadata.build(starts, torch.tensor(lens), table)


def _cache(dtype=torch.float16, seed=1):
    g = torch.Generator().manual_seed(seed)
    shape = TorchNativeBackend.get_kv_cache_shape(NUM_BLOCKS, BLOCK, KV_HEADS, HEAD)
    return torch.randn(shape, generator=g).to(dtype)


def _query(md, dtype=torch.float16, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(md.num_tokens, HEADS, HEAD, generator=g).to(dtype)


if not UNDER_TRITON_INTERPRETER:
    # ------------------------------------------------------------------ the metadata's rules
    def test_metadata_fields_cannot_be_reassigned():
        md = _metadata([20, 33])
        with pytest.raises(dataclasses.FrozenInstanceError):
            md.seq_lens = torch.tensor([5, 5], dtype=torch.int32)
        with pytest.raises(dataclasses.FrozenInstanceError):
            md.max_seq_len = 5
        # A copy made by replace starts with its own (empty) cache, and is checked anew.
        md.checked_cache()["x"] = 1
        other = dataclasses.replace(md, block_table=md.block_table.clone())
        assert "x" not in other.checked_cache() and "x" in md.checked_cache()

    def test_a_block_table_written_in_place_is_checked_again():
        impl = TorchNativeBackend(HEADS, HEAD, KV_HEADS, 0.125)
        md, cache = _metadata([20, 33]), _cache()
        impl.forward(_query(md), cache, md)
        md.checked_cache()["derived"] = 1
        md.block_table[1, 0] = NUM_BLOCKS + 3  # out of range, written after the check
        with pytest.raises(ValueError, match=rf"block_table\[1, 0\]={NUM_BLOCKS + 3} is out"):
            impl.forward(_query(md), cache, md)
        assert "derived" not in md.checked_cache()  # derived values went with the check
        md.block_table[1, 0] = 7
        impl.forward(_query(md), cache, md)  # valid again: checked and served

    def test_lengths_written_in_place_are_refused():
        impl = TorchNativeBackend(HEADS, HEAD, KV_HEADS, 0.125)
        md, cache = _metadata([20, 33]), _cache()
        impl.forward(_query(md), cache, md)
        md.seq_lens.add_(1)  # the host copies (seq_lens_host, max_seq_len) are stale now
        with pytest.raises(ValueError, match="seq_lens written in place after build"):
            impl.forward(_query(md), cache, md)
        with pytest.raises(ValueError, match="seq_lens written in place"):
            md.checked_cache()

    def test_the_cache_check_reads_host_copies_made_by_build():
        md = _metadata([20, 33])
        table, slots = md._host_tables()
        assert table.device.type == "cpu" and slots is None
        assert torch.equal(table, md.block_table.cpu())
        assert md._host_tables()[0] is table  # made once per batch

    def test_inference_mode_metadata_is_served():
        # Inference tensors have no version counter: nothing to compare, nothing raised.
        with torch.inference_mode():
            md = _metadata([20, 33])
            out = TorchNativeBackend(HEADS, HEAD, KV_HEADS, 0.125).forward(_query(md), _cache(), md)
        assert out.shape == (2, HEADS, HEAD) and md.checked_cache() == {}

    def test_triton_paged_per_call_path_under_the_interpreter():
        rerun_under_triton_interpreter(__file__)

else:
    from opcore.attention.backends import _triton_paged_plan as plan_module
    from opcore.attention.backends.triton_paged import TritonPagedBackend

    class Counted:
        """A `TritonPagedBackend` counting its checked calls (``full``) and the runs that
        were not replays (``runs``)."""

        def __init__(self, **settings) -> None:
            self.impl = TritonPagedBackend(HEADS, HEAD, KV_HEADS, HEAD**-0.5)
            for name, value in settings.items():
                setattr(self.impl, name, value)
            self.full = self.runs = 0
            full, launch = self.impl._forward_full, self.impl._launch

            def counting_full(*args):
                self.full += 1
                return full(*args)

            def counting_launch(*args):
                self.runs += 1
                return launch(*args)

            self.impl._forward_full = counting_full
            self.impl._launch = counting_launch  # what the binder records

        @property
        def counts(self) -> tuple[int, int]:
            return self.full, self.runs

        def __call__(self, query, cache, md, out=None):
            return self.impl.forward(query, cache, md, out)

    def unreplayed(query, cache, md, out=None, **settings):
        """The full path of a fresh backend: checks, plan, and the recorded run."""
        impl = TritonPagedBackend(HEADS, HEAD, KV_HEADS, HEAD**-0.5)
        for name, value in settings.items():
            setattr(impl, name, value)
        return impl._forward_full(query, cache, md, out, impl._settings())

    def native(query, cache, md):
        ref = TorchNativeBackend(HEADS, HEAD, KV_HEADS, HEAD**-0.5).forward(query, cache, md)
        return ref.float()

    @pytest.mark.parametrize("splits", [1, 3])
    def test_a_second_batch_of_the_same_shapes_is_replayed_bitwise(splits):
        f = Counted(num_splits=splits)
        cache = _cache()
        a = _metadata([150, 33, 70], seed=0)
        first = f(_query(a), cache, a)
        assert f.counts == (1, 1) and len(f.impl._replays) == 1
        (replay,) = f.impl._replays.values()
        assert replay.__qualname__.startswith("_interpreted_replay")
        assert torch.equal(f(_query(a), cache, a), first) and f.counts == (1, 1)
        # Another batch: new block table, new lengths, new query; same shapes and splits.
        b = _metadata([40, 129, 17], seed=5, width=10)  # the table's width is a shape
        qb = _query(b, seed=9)
        got = f(qb, cache, b)
        assert f.counts == (2, 1), "checked once as a new batch, then replayed"
        assert torch.equal(f(qb, cache, b), got) and f.counts == (2, 1)
        assert torch.equal(got, unreplayed(qb, cache, b, num_splits=splits))
        assert torch.allclose(got.float(), native(qb, cache, b), atol=2e-3, rtol=2e-3)
        assert not torch.equal(got, first)
        # A caller's output tensor is written and returned, by its own binding.
        out = torch.empty_like(qb)
        assert f(qb, cache, b, out) is out and f.counts == (3, 2)
        out2 = torch.full_like(qb, float("nan"))
        assert f(qb, cache, b, out2) is out2 and f.counts == (3, 2)
        assert torch.equal(out2, got)

    def test_the_legacy_prefill_kernel_is_replayed_bitwise():
        f = Counted(prefill_path="legacy")
        cache = _cache()
        a = _metadata([40, 70], [5, 9], seed=0, width=6)
        f(_query(a), cache, a)
        b = _metadata([90, 12], [5, 9], seed=3, width=6)  # same tokens, longest query, width
        qb = _query(b, seed=4)
        got = f(qb, cache, b)
        assert f.counts == (2, 1)
        assert torch.equal(got, unreplayed(qb, cache, b, prefill_path="legacy"))
        assert torch.allclose(got.float(), native(qb, cache, b), atol=2e-3, rtol=2e-3)

    def test_another_shape_layout_or_split_takes_the_full_path():
        cache = _cache()
        f = Counted(num_splits=2)
        a = _metadata([150, 33], seed=0)
        f(_query(a), cache, a)
        wide = torch.randn(2, 2 * HEADS, HEAD).half()
        buf = torch.randn(2 * HEADS * HEAD + 1).half()
        variants = {
            "batch size": (lambda md: _query(md), _metadata([150, 33, 20], seed=1), cache),
            "dtype": (lambda md: _query(md, torch.bfloat16), a, _cache(torch.bfloat16)),
            "strided query": (lambda md: wide[:, HEADS:], a, cache),
            "misaligned query": (lambda md: buf[1:].view(2, HEADS, HEAD), a, cache),
            "wider block table": (lambda md: _query(md), _metadata([150, 33], width=12), cache),
        }
        for name, (make_query, md, kv) in variants.items():
            for round_ in range(2):  # recorded once, then replayed
                before = f.runs
                q = make_query(md)
                got = f(q, kv, md)
                assert f.runs == before + (1 - round_), (name, round_)
                ref = native(q, kv, md)
                assert torch.allclose(got.float(), ref, atol=3e-2, rtol=3e-2), name
        assert f.runs == len(variants) + 1 and len(f.impl._replays) == len(variants) + 1
        # A changed setting is a new plan: here a new split count.
        f.impl.num_splits = 3
        q = _query(a)
        got = f(q, cache, a)
        assert f.runs == len(variants) + 2
        assert torch.equal(got, unreplayed(q, cache, a, num_splits=3))

    def test_the_automatic_split_count_is_part_of_the_plan():
        # The interpreter counts 4 multiprocessors: one sequence over 2 kv heads wants 8
        # splits, capped by the context (a split keeps at least 4 tiles of 64 keys).
        f = Counted()
        cache = _cache()
        short, long_ = _metadata([300], seed=0), _metadata([600], seed=1)
        for md in (short, long_, short, long_):
            f(_query(md), cache, md)
        assert f.counts == (2, 2)
        splits = sorted(p.splits for p, _ in f.impl._replays)
        assert splits == [1, 2]

    def test_one_plan_per_batch_for_every_layer():
        cache = _cache()
        md = _metadata([150, 33], seed=0)
        layers = [Counted(num_splits=2) for _ in range(3)]
        q = _query(md)
        outs = [layer(q, cache, md) for layer in layers]
        assert all(torch.equal(o, outs[0]) for o in outs)
        (plan,) = md.checked_cache().values()  # made by the first layer, used by all
        assert plan.kind == plan_module.DECODE and plan.splits == 2
        assert all(next(iter(layer.impl._replays))[0] is plan for layer in layers)

    def test_a_block_table_written_in_place_is_not_served_stale():
        f = Counted(num_splits=2)
        cache = _cache()
        md = _metadata([150, 33], seed=0)
        f(_query(md), cache, md)
        f(_query(md), cache, md)
        assert f.counts == (1, 1)
        # New valid blocks for sequence 0: read by the kernel on this very call.
        md.block_table[0] = torch.arange(30, 40, dtype=torch.int32)[: md.block_table.shape[1]]
        q = _query(md, seed=7)
        got = f(q, cache, md)
        assert f.counts == (2, 1)  # checked again, its plan made anew; the launch replayed
        fresh = PagedAttentionMetadata.build(
            md.query_start_loc, md.seq_lens, md.block_table.clone()
        )
        assert torch.equal(got, unreplayed(q, cache, fresh, num_splits=2))
        md.block_table[1, 0] = -1  # out of range: the check runs again and says so
        with pytest.raises(ValueError, match=r"block_table\[1, 0\]=-1 is out of range"):
            f(q, cache, md)
        md.block_table[1, 0] = 3
        md.seq_lens[0] = 20  # lengths: the host copies are stale, refused
        with pytest.raises(ValueError, match="seq_lens written in place after build"):
            f(q, cache, md)

    @pytest.mark.parametrize("splits", [1, 3])
    def test_prefill_and_mixed_batches_are_replayed_bitwise(splits):
        # A prefill batch (no decode row) and a mixed one (decode rows through the decode
        # kernel, the rest through the prefill kernel): a second batch of the same plan
        # (other lengths, block table and query; same token and sequence counts) is served
        # by the replay bound for the first, bit for bit the full path's answer.
        for qlens in ([5, 9], [1, 13]):
            f = Counted(num_splits=splits)
            cache = _cache()
            a = _metadata([40, 70], qlens, seed=0, width=6)
            f(_query(a), cache, a)
            assert f.counts == (1, 1) and len(f.impl._replays) == 1, qlens
            b = _metadata([90, 21], qlens, seed=3, width=6)
            qb = _query(b, seed=4)
            got = f(qb, cache, b)
            assert f.counts == (2, 1), "checked once as a new batch, then replayed"
            assert torch.equal(got, unreplayed(qb, cache, b, num_splits=splits)), qlens
            assert torch.allclose(got.float(), native(qb, cache, b), atol=2e-3, rtol=2e-3)

    def test_an_output_that_is_the_query_is_not_bound():
        f = Counted(num_splits=1)
        cache = _cache()
        md = _metadata([150, 33], seed=0)
        ref = unreplayed(_query(md), cache, md, num_splits=1)
        for _ in range(2):
            q = _query(md)
            assert f(q, cache, md, q) is q
            assert torch.equal(q, ref)
        assert f.counts == (2, 2) and f.impl._replays == {}

    def test_bad_calls_after_a_replay_still_fail_clearly():
        f = Counted(num_splits=2)
        cache = _cache()
        md = _metadata([150, 33], seed=0)
        f(_query(md), cache, md)
        with pytest.raises(ValueError, match="query has 3 tokens but query_start_loc"):
            f(torch.randn(3, HEADS, HEAD).half(), cache, md)
        with pytest.raises(ValueError, match="out must be a tensor like the query"):
            f(_query(md), cache, md, torch.empty(2, HEADS, HEAD))
        with pytest.raises(ValueError, match="block_table is too short"):
            f(_query(md), _cache().view(2, -1, 8, KV_HEADS, HEAD), md)
