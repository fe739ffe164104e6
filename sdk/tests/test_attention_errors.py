"""Bad input is rejected with an error that names the argument and what was expected."""

from __future__ import annotations

import pytest
import torch

from opcore.attention import PagedAttentionMetadata
from opcore.attention.backends.torch_native import TorchNativeBackend

I32 = torch.int32


def build(starts=(0, 1, 4), lens=(17, 3), table=((0, 1), (2, 3))):
    return PagedAttentionMetadata.build(
        torch.tensor(starts, dtype=I32),
        torch.tensor(lens, dtype=I32),
        torch.tensor(table, dtype=I32),
    )


@pytest.fixture
def impl():
    return TorchNativeBackend(4, 8, 2, 0.35)


@pytest.fixture
def cache():
    return TorchNativeBackend.allocate_kv_cache(6, 16, 2, 8, torch.float32, "cpu").normal_()


def test_block_table_too_short_for_the_context(impl, cache):
    md = build(lens=(40, 3))
    with pytest.raises(
        ValueError,
        match=(
            r"block_table is too short: sequence 0 has seq_lens\[0\]=40, which needs 3 blocks "
            r"of block_size 16, but block_table has 2 columns"
        ),
    ):
        impl.forward(torch.randn(4, 4, 8), cache, md)


def test_block_id_out_of_range(impl, cache):
    md = build(table=((0, 9), (2, 3)))
    with pytest.raises(
        ValueError, match=r"block_table\[0, 1\]=9 is out of range for a kv cache of 6 blocks"
    ):
        impl.forward(torch.randn(4, 4, 8), cache, md)


def test_unused_block_table_entries_are_not_checked(impl, cache):
    # Sequence 1 needs one block; its second entry is padding and may hold anything.
    md = build(table=((0, 1), (2, -7)))
    assert impl.forward(torch.randn(4, 4, 8), cache, md).shape == (4, 4, 8)


def test_slot_mapping_out_of_range(impl, cache):
    k = torch.randn(3, 2, 8)
    with pytest.raises(
        ValueError,
        match=(
            r"slot_mapping\[1\]=96 is out of range: the kv cache holds 96 slots "
            r"\(num_blocks 6 x block_size 16\)"
        ),
    ):
        impl.write_kv(k, k, cache, torch.tensor([5, 96, -1]))
    md = PagedAttentionMetadata.build(
        torch.tensor([0, 1], dtype=I32),
        torch.tensor([3], dtype=I32),
        torch.tensor([[0]], dtype=I32),
        slot_mapping=torch.tensor([200]),
    )
    with pytest.raises(ValueError, match=r"slot_mapping\[0\]=200 is out of range"):
        impl.forward(torch.randn(1, 4, 8), cache, md)


def test_slot_mapping_length(impl, cache):
    k = torch.randn(3, 2, 8)
    with pytest.raises(
        ValueError, match=r"slot_mapping must be 1-D with one slot per key row \(3\)"
    ):
        impl.write_kv(k, k, cache, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"slot_mapping must be 1-D with num_tokens=4 entries"):
        PagedAttentionMetadata.build(
            torch.tensor([0, 1, 4], dtype=I32),
            torch.tensor([5, 3], dtype=I32),
            torch.zeros((2, 1), dtype=I32),
            slot_mapping=torch.tensor([1, 2]),
        )


@pytest.mark.parametrize(
    "arg, shape, expected",
    [
        (
            "query",
            (4, 3, 8),
            r"query must have shape \[num_tokens, 4, 8\] \(num_heads=4, head_size=8\), "
            r"got \(4, 3, 8\)",
        ),
        ("query", (4, 4, 16), r"query must have shape \[num_tokens, 4, 8\]"),
        (
            "key",
            (2, 4, 8),
            r"key must have shape \[num_tokens, 2, 8\] \(num_kv_heads=2, head_size=8\), "
            r"got \(2, 4, 8\)",
        ),
        ("value", (2, 1, 8), r"value must have shape \[num_tokens, 2, 8\]"),
    ],
)
def test_mismatched_head_counts(impl, cache, arg, shape, expected):
    if arg == "query":
        with pytest.raises(ValueError, match=expected):
            impl.forward(torch.randn(shape), cache, build())
    else:
        good = torch.randn(2, 2, 8)
        bad = torch.randn(shape)
        key, value = (bad, good) if arg == "key" else (good, bad)
        with pytest.raises(ValueError, match=expected):
            impl.write_kv(key, value, cache, torch.tensor([0, 1]))


def test_kv_cache_for_another_layer(impl):
    other = TorchNativeBackend.allocate_kv_cache(6, 16, 4, 8, torch.float32, "cpu")
    with pytest.raises(
        ValueError,
        match=r"kv_cache has 4 kv heads of size 8, but the layer has num_kv_heads=2, head_size=8",
    ):
        impl.forward(torch.randn(4, 4, 8), other, build())
    with pytest.raises(
        ValueError,
        match=r"kv_cache must have shape \(2, num_blocks, block_size, num_kv_heads, head_size\)",
    ):
        impl.forward(torch.randn(4, 4, 8), other[0], build())


def test_query_token_count_must_match_the_batch(impl, cache):
    with pytest.raises(ValueError, match=r"query has 5 tokens but query_start_loc\[-1\] is 4"):
        impl.forward(torch.randn(5, 4, 8), cache, build())


@pytest.mark.parametrize(
    "kw, expected",
    [
        (dict(lens=(17, 2)), r"seq_lens\[1\]=2 is smaller than sequence 1's query length 3"),
        (dict(starts=(1, 1, 4)), r"query_start_loc\[0\] must be 0, got 1"),
        (dict(starts=(0, 3, 2)), r"query_start_loc must be non-decreasing"),
        (dict(lens=(17,)), r"seq_lens must be 1-D with num_seqs=2 entries"),
        (dict(table=((0, 1),)), r"block_table must be 2-D \[num_seqs=2, max_blocks_per_seq\]"),
    ],
)
def test_malformed_batch(kw, expected):
    with pytest.raises(ValueError, match=expected):
        build(**kw)


def test_integer_dtypes_are_required():
    with pytest.raises(ValueError, match="block_table must be int32 or int64, got torch.float32"):
        PagedAttentionMetadata.build(
            torch.tensor([0, 1], dtype=I32), torch.tensor([1], dtype=I32), torch.zeros((1, 1))
        )


def test_write_kv_checks_a_batchs_own_slots_once_on_the_host(impl, cache, monkeypatch):
    # A batch's metadata.slot_mapping is checked through the batch's host copies, once per
    # batch and cache geometry, not on the device at every layer's write (a wait for the
    # device each time); any other slot tensor still is; an in-place write into the batch's
    # slots (counted by torch) is seen and checked again; a bad slot raises before writing.
    from opcore.attention import paged

    device_checks = []
    real = paged.check_slot_mapping

    def counting(slots, *a):
        device_checks.append(slots)
        return real(slots, *a)

    monkeypatch.setattr(paged, "check_slot_mapping", counting)
    slots = torch.tensor([5, 17, 33, 40])
    md = PagedAttentionMetadata.build(
        torch.tensor([0, 1, 4], dtype=I32),
        torch.tensor([6, 3], dtype=I32),
        torch.tensor([[0], [2]], dtype=I32),
        slot_mapping=slots,
    )
    k = torch.randn(4, 2, 8)
    for _ in range(3):  # three layers of one step
        impl.write_kv(k, k, cache, md.slot_mapping)
    assert len(device_checks) == 1  # once for the step (check_cache, on the host copy)
    assert torch.equal(cache[0].reshape(-1, 2, 8)[md.slot_mapping], k)
    impl.write_kv(k, k, cache, slots.clone())  # not the batch's tensor: checked per call
    assert len(device_checks) == 2
    md.slot_mapping[2] = 500  # an in-place write: the batch is checked again, and fails
    before = cache.clone()
    with pytest.raises(ValueError, match=r"slot_mapping\[2\]=500 is out of range"):
        impl.write_kv(k, k, cache, md.slot_mapping)
    assert torch.equal(cache, before)
