"""Paged-KV batch description and the input checks every backend shares.

A batch holds ``B`` sequences. Sequence ``i`` brings ``query_len[i] = query_start_loc[i+1]
- query_start_loc[i]`` new tokens (rows ``query_start_loc[i]:query_start_loc[i+1]`` of the
query) and has ``seq_lens[i]`` tokens of context *including* those new tokens; the new
tokens sit at absolute positions ``seq_lens[i] - query_len[i] ... seq_lens[i] - 1``. Token
position ``p`` of sequence ``i`` lives in physical block ``block_table[i, p // block_size]``
at offset ``p % block_size``. A decode sequence has ``query_len == 1``; a prefill (or a
chunk of one) has more; one batch may mix both.

`PagedAttentionMetadata.build` checks the structure once and keeps host copies of the
lengths, the block table and the slots (device->host copies once per batch, shared by every
layer). `check_cache` checks them against a cache's geometry (block ids and slots in range,
block tables long enough) on the host, and remembers that it did, so a batch is checked
once per cache geometry, not once per layer, and a forward never waits for the device.

A metadata object is one batch: its fields cannot be reassigned (frozen), and what is
derived from it is cached on it (`checked_cache`; docs/attention.md#per-batch-cache). Torch
counts in-place writes into a tensor (its version counter, shared by its views), and each
use compares the counts with those seen when the cached values were made: after a write
into ``block_table`` or ``slot_mapping`` the host copies are made again and the cache
checks redone; after a write into ``query_start_loc`` or ``seq_lens`` the host copies of
the lengths (which choose kernels, grids and split counts) no longer describe the batch,
and its next use raises. Writes torch does not count (tensors made under
``torch.inference_mode``, which have no counter; writes through ``.data``, a NumPy or
DLPack alias, a kernel or a graph replay) are not seen: build a new metadata instead.
"""

from __future__ import annotations

import dataclasses
import operator
import weakref
from typing import Any

import torch

_INT_DTYPES = (torch.int32, torch.int64)
_version = operator.attrgetter("_version")
# The tensors whose in-place writes invalidate what was derived from them (see the module
# docstring): the lengths, whose host copies cannot be refreshed behind the caller's back,
# and the tables, whose checks can be redone.
_LENGTHS = ("query_start_loc", "seq_lens")
_TABLES = ("block_table", "slot_mapping")
# A batch's slot_mapping tensor -> its metadata, while the metadata lives (it holds the
# tensor, so the id cannot be reused meanwhile): `write_kv` given a batch's own slots checks
# them through the batch's host copies (`checked_slots`) instead of on the device.
_SLOT_OWNERS: weakref.WeakValueDictionary[int, PagedAttentionMetadata] = (
    weakref.WeakValueDictionary()
)


class _BatchState:
    """What is derived from one metadata object: host copies of its tables, the cache
    geometries checked, backends' derived values, and the version counts of the tensors
    they were derived from (``None``: not yet recorded)."""

    __slots__ = ("watched", "names", "versions", "table_host", "slots_host", "checked", "derived")

    def __init__(self) -> None:
        self.watched: tuple[torch.Tensor, ...] = ()
        self.names: tuple[str, ...] = ()
        self.versions: tuple[int, ...] | None = None
        self.table_host: torch.Tensor | None = None
        self.slots_host: torch.Tensor | None = None
        self.checked: set[tuple[int, int]] = set()
        self.derived: dict[Any, Any] = {}


def _as_int_vector(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _INT_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")


@dataclasses.dataclass(frozen=True)
class PagedAttentionMetadata:
    """One batch's layout. Build it with `build`; see the module docstring."""

    query_start_loc: torch.Tensor  # [B + 1], int32
    seq_lens: torch.Tensor  # [B], int32
    block_table: torch.Tensor  # [B, max_blocks_per_seq], int32
    slot_mapping: torch.Tensor | None  # [num_tokens], int64, or None
    query_lens_host: list[int]
    seq_lens_host: list[int]
    num_tokens: int
    max_query_len: int
    max_seq_len: int
    # Sequences with exactly one new token (decode rows), counted once here.
    num_decode_seqs: int = 0
    # Not an argument: `dataclasses.replace` gives the copy a state of its own.
    _state: _BatchState = dataclasses.field(
        default_factory=_BatchState, init=False, repr=False, compare=False
    )

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @classmethod
    def build(
        cls,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor | None = None,
    ) -> PagedAttentionMetadata:
        """Check the batch structure and return the metadata (tensors stay on their device;
        integer tensors are converted to int32, slots to int64)."""
        _as_int_vector("query_start_loc", query_start_loc)
        _as_int_vector("seq_lens", seq_lens)
        _as_int_vector("block_table", block_table)
        if query_start_loc.dim() != 1 or query_start_loc.numel() < 1:
            raise ValueError(
                "query_start_loc must be 1-D with num_seqs + 1 entries, got shape "
                f"{tuple(query_start_loc.shape)}"
            )
        num_seqs = query_start_loc.numel() - 1
        if seq_lens.dim() != 1 or seq_lens.numel() != num_seqs:
            raise ValueError(
                f"seq_lens must be 1-D with num_seqs={num_seqs} entries (from query_start_loc), "
                f"got shape {tuple(seq_lens.shape)}"
            )
        if block_table.dim() != 2 or block_table.shape[0] != num_seqs:
            raise ValueError(
                f"block_table must be 2-D [num_seqs={num_seqs}, max_blocks_per_seq], "
                f"got shape {tuple(block_table.shape)}"
            )
        devices = {t.device for t in (query_start_loc, seq_lens, block_table)}
        if len(devices) != 1:
            raise ValueError(
                "query_start_loc, seq_lens and block_table must be on one device, got "
                f"{sorted(map(str, devices))}"
            )
        starts = query_start_loc.tolist()
        lens = seq_lens.tolist()
        if starts[0] != 0:
            raise ValueError(f"query_start_loc[0] must be 0, got {starts[0]}")
        query_lens = []
        for i in range(num_seqs):
            q = starts[i + 1] - starts[i]
            if q < 0:
                raise ValueError(
                    "query_start_loc must be non-decreasing: "
                    f"query_start_loc[{i + 1}]={starts[i + 1]} < query_start_loc[{i}]={starts[i]}"
                )
            if lens[i] < q:
                raise ValueError(
                    f"seq_lens[{i}]={lens[i]} is smaller than sequence {i}'s query length {q}: "
                    "seq_lens counts the context including the new tokens"
                )
            query_lens.append(q)
        num_tokens = starts[-1]
        if slot_mapping is not None:
            _as_int_vector("slot_mapping", slot_mapping)
            if slot_mapping.dim() != 1 or slot_mapping.numel() != num_tokens:
                raise ValueError(
                    f"slot_mapping must be 1-D with num_tokens={num_tokens} entries "
                    f"(query_start_loc[-1]), got shape {tuple(slot_mapping.shape)}"
                )
            slot_mapping = slot_mapping.to(torch.int64)
        md = cls(
            query_start_loc=query_start_loc.to(torch.int32),
            seq_lens=seq_lens.to(torch.int32),
            block_table=block_table.to(torch.int32),
            slot_mapping=slot_mapping,
            query_lens_host=query_lens,
            seq_lens_host=lens,
            num_tokens=num_tokens,
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(lens, default=0),
            num_decode_seqs=sum(1 for q in query_lens if q == 1),
        )
        md._state_now()
        md._host_tables()  # the batch's device->host copies, here rather than in a forward
        if md.slot_mapping is not None:
            _SLOT_OWNERS[id(md.slot_mapping)] = md
        return md

    # ------------------------------------------------------------------ derived values
    def _state_now(self) -> _BatchState:
        """The state, after comparing the watched tensors' version counts with those its
        values were derived from (see the module docstring)."""
        st = self._state
        if st.versions is None:
            tracked = [
                (n, t)
                for n in _LENGTHS + _TABLES
                if (t := getattr(self, n)) is not None and not t.is_inference()
            ]
            st.names = tuple(n for n, _ in tracked)
            st.watched = tuple(t for _, t in tracked)
            st.versions = tuple(map(_version, st.watched))
            return st
        now = tuple(map(_version, st.watched))
        if now != st.versions:
            written = [n for n, a, b in zip(st.names, st.versions, now, strict=True) if a != b]
            lengths = [n for n in written if n in _LENGTHS]
            if lengths:
                raise ValueError(
                    f"PagedAttentionMetadata: {' and '.join(lengths)} written in place after "
                    "build: its host copies of the lengths no longer describe the batch; "
                    "build a new PagedAttentionMetadata for the new contents"
                )
            # New table contents: the host copies and everything checked against them go.
            st.table_host = st.slots_host = None
            st.checked.clear()
            st.derived.clear()
            st.versions = now
        return st

    def checked_cache(self) -> dict[Any, Any]:
        """The cache of values derived from this batch, for backends (keys: a tuple that
        starts with the backend's name). It is emptied when ``block_table`` or
        ``slot_mapping`` were written in place since the values were made (they must be
        checked again), and raises ``ValueError`` when ``query_start_loc`` or ``seq_lens``
        were."""
        st = self._state
        # Inline of `_state_now`'s common case: this runs on every forward.
        if st.versions is not None and tuple(map(_version, st.watched)) == st.versions:
            return st.derived
        return self._state_now().derived

    def _host_tables(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        st = self._state
        if st.table_host is None:
            st.table_host = self.block_table.cpu()
            st.slots_host = None if self.slot_mapping is None else self.slot_mapping.cpu()
        return st.table_host, st.slots_host

    def check_cache(self, num_blocks: int, block_size: int) -> None:
        """Check block tables and slots against a cache of ``num_blocks`` blocks of
        ``block_size`` slots, on the host copies. Done once per geometry per batch (again
        after an in-place write into the tables)."""
        st = self._state_now()
        key = (num_blocks, block_size)
        if key in st.checked:
            return
        width = self.block_table.shape[1]
        for i, length in enumerate(self.seq_lens_host):
            need = -(-length // block_size)
            if need > width:
                raise ValueError(
                    f"block_table is too short: sequence {i} has seq_lens[{i}]={length}, which "
                    f"needs {need} blocks of block_size {block_size}, but block_table has "
                    f"{width} columns"
                )
        table, slots = self._host_tables()
        if self.num_seqs and width:
            cols = torch.arange(width)
            lens = torch.tensor(self.seq_lens_host, dtype=torch.int64)
            used = cols[None, :] < ((lens + block_size - 1) // block_size)[:, None]
            bad = used & ((table < 0) | (table >= num_blocks))
            if bool(bad.any()):
                i, j = (int(x) for x in bad.nonzero()[0])
                raise ValueError(
                    f"block_table[{i}, {j}]={int(table[i, j])} is out of range for a "
                    f"kv cache of {num_blocks} blocks"
                )
        if slots is not None:
            check_slot_mapping(slots, num_blocks * block_size, num_blocks, block_size)
        st.checked.add(key)


def checked_slots(slot_mapping: torch.Tensor, num_blocks: int, block_size: int) -> bool:
    """True when ``slot_mapping`` is the ``slot_mapping`` of a live batch
    (`PagedAttentionMetadata.build`), after that batch's `check_cache` for this geometry has
    passed: on its host copies, once per batch (again after an in-place write torch counts),
    with no wait for the device. False for any other tensor, which the caller checks itself
    (`check_slot_mapping`). Raises what `check_cache` raises."""
    md = _SLOT_OWNERS.get(id(slot_mapping))
    if md is None or md.slot_mapping is not slot_mapping:
        return False
    md.check_cache(num_blocks, block_size)
    return True


def check_slot_mapping(
    slot_mapping: torch.Tensor, num_slots: int, num_blocks: int, block_size: int
) -> None:
    """Raise if any non-negative slot is ``>= num_slots`` (negative slots are padding)."""
    if slot_mapping.numel() == 0:
        return
    bad = slot_mapping >= num_slots
    if bool(bad.any()):
        t = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"slot_mapping[{t}]={int(slot_mapping[t])} is out of range: the kv cache holds "
            f"{num_slots} slots (num_blocks {num_blocks} x block_size {block_size})"
        )


def compute_slot_mapping(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """The slots of every new token of the batch (int64, on ``block_table``'s device):
    token ``p`` of sequence ``i`` goes to ``block_table[i, p // block_size] * block_size +
    p % block_size``."""
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    slots = []
    table = block_table.to(torch.int64)
    for i, length in enumerate(lens):
        n = starts[i + 1] - starts[i]
        pos = torch.arange(length - n, length, device=block_table.device)
        slots.append(table[i, pos // block_size] * block_size + pos % block_size)
    if not slots:
        return torch.empty(0, dtype=torch.int64, device=block_table.device)
    return torch.cat(slots)


def check_qkv(
    backend: str,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    query: torch.Tensor | None = None,
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
) -> None:
    """Shape checks for query ``[T, num_heads, head_size]`` and key/value ``[T,
    num_kv_heads, head_size]``; errors name the argument and the expected shape."""
    for arg, t, heads in (
        ("query", query, num_heads),
        ("key", key, num_kv_heads),
        ("value", value, num_kv_heads),
    ):
        if t is None:
            continue
        if t.dim() != 3 or t.shape[1] != heads or t.shape[2] != head_size:
            raise ValueError(
                f"{backend}: {arg} must have shape [num_tokens, {heads}, {head_size}] "
                f"({'num_heads' if arg == 'query' else 'num_kv_heads'}={heads}, "
                f"head_size={head_size}), got {tuple(t.shape)}"
            )
    if key is not None and value is not None and key.shape[0] != value.shape[0]:
        raise ValueError(f"{backend}: key has {key.shape[0]} tokens but value has {value.shape[0]}")
