"""Conformance cases for attention backends, and their runner.

The conformance suite (``opcore_conformance``) calls this interface:

``conformance_cases(quick: bool) -> Iterator[AttentionCase]``
    The full grid is every combination of batch mix (``"decode"``: one new token per
    sequence; ``"prefill"``: whole prompts and a chunked prefill; ``"mixed"``: both in one
    batch), block size 16/32/64, GQA ratio 1/4/8 (2 kv heads), head size 64/128, sliding
    window none/32, dtype float16/bfloat16 (216 cases), plus soft-cap, non-causal and MQA
    cases, and prefill/chunked cases at tile edges (`EDGE_MIXES`: new-token counts 1, 127,
    128 and 129 around 64- and 128-row query tiles and 64-key tiles, whole prompts and chunks over
    a cached prefix that ends inside a page, windows that cut tiles, pages smaller than,
    equal to and larger than a key tile, and a page size that is no power of two).
    ``quick=True`` yields a small subset that still takes every value of every axis.
    Cases are frozen dataclasses with a stable ``name`` (use it as the test id).

``case_reasons(backend_name, case, device) -> list[str]``
    Why the backend (as the current platform maps that name) cannot run the case on
    ``device``: the backend's ``validate_configuration`` reasons. Empty: it must pass.
    The suite skips a case with these reasons rather than failing it.

``run_case(backend_name, case, device) -> CaseResult``
    Runs the backend on ``device`` and compares it with ``TORCH_NATIVE`` computed in
    float64 on the CPU from the same (rounded to the case dtype) inputs. The cache is
    filled with NaN first and the batch carries padding rows with slot ``-1`` and NaN
    keys, so a backend that reads a slot it should not, or writes a padding row, shows up
    as NaN (an infinite error). ``CaseResult`` is a named tuple ``(max_abs_err,
    max_rel_err, atol, rtol)`` with ``.passed``: ``max_rel_err`` is
    ``max |out - ref| / (atol / rtol + |ref|)``, so ``max_rel_err <= rtol`` is exactly
    ``torch.allclose(out, ref, rtol=rtol, atol=atol)``. Raises `CaseNotSupported` (with
    the reasons) if the backend cannot run the case.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import torch

from opcore.attention.paged import PagedAttentionMetadata, compute_slot_mapping
from opcore.attention.registry import normalize_name
from opcore.attention.selector_config import AttentionSelectorConfig, dtype_name

if TYPE_CHECKING:
    from opcore.attention.backend import AttentionBackend

# (query_lens, seq_lens) per batch mix. Lengths straddle block boundaries on purpose, and
# include a context of 1, a prompt shorter than a block and a chunked prefill.
BATCH_MIXES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "decode": ((1, 1, 1, 1, 1), (1, 37, 150, 300, 64)),
    "prefill": ((23, 70, 5, 40), (23, 70, 5, 130)),
    "mixed": ((1, 33, 1, 17, 1), (200, 33, 77, 90, 16)),
}
# Tile-edge batches (query_lens, seq_lens), for the prefill kernel's 64/128-row query tiles and
# 64-key tiles: whole prompts of 1, 127, 128 and 129 tokens; chunks of those lengths over a
# cached prefix that ends inside a page (33, 256 + 1, 100 tokens before the chunk) and a
# decode row; a long chunk whose window cuts tiles on both sides.
EDGE_MIXES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "edges": ((1, 127, 128, 129), (1, 127, 128, 129)),
    "chunked": ((127, 129, 128, 1), (160, 386, 228, 17)),
    "longchunk": ((257,), (700,)),
}
BLOCK_SIZES = (16, 32, 64)
GQA_RATIOS = (1, 4, 8)
HEAD_SIZES = (64, 128)
WINDOWS = (None, 32)
DTYPES = (torch.float16, torch.bfloat16)
NUM_KV_HEADS = 2

TOLERANCES = {
    torch.float16: (3e-3, 3e-3),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float32: (1e-4, 1e-4),
    torch.float64: (1e-10, 1e-10),
}


class CaseNotSupported(ValueError):
    """The backend's capability check rejects the case; ``reasons`` says why."""

    def __init__(self, backend: str, case: AttentionCase, reasons: list[str]) -> None:
        super().__init__(f"{backend} cannot run {case.name}: {'; '.join(reasons)}")
        self.reasons = reasons


@dataclasses.dataclass(frozen=True)
class AttentionCase:
    """One conformance case; see the module docstring."""

    name: str
    mix: str
    dtype: torch.dtype
    block_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    causal: bool = True
    seed: int = 0

    def selector_config(self, device_type: str | None) -> AttentionSelectorConfig:
        return AttentionSelectorConfig(
            head_size=self.head_size,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            dtype=self.dtype,
            block_size=self.block_size,
            sliding_window=self.sliding_window,
            causal=self.causal,
            logits_soft_cap=self.logits_soft_cap,
            device_type=device_type,
        )


class CaseResult(NamedTuple):
    max_abs_err: float
    max_rel_err: float
    atol: float
    rtol: float

    @property
    def passed(self) -> bool:
        return self.max_rel_err <= self.rtol


def make_case(
    mix: str,
    dtype: torch.dtype,
    block_size: int,
    gqa: int,
    head_size: int,
    window: int | None,
    *,
    num_kv_heads: int = NUM_KV_HEADS,
    logits_soft_cap: float | None = None,
    causal: bool = True,
    query_lens: tuple[int, ...] | None = None,
    seq_lens: tuple[int, ...] | None = None,
) -> AttentionCase:
    q_lens, s_lens = BATCH_MIXES.get(mix) or EDGE_MIXES[mix]
    q_lens = query_lens or q_lens
    s_lens = seq_lens or s_lens
    parts = [
        mix,
        dtype_name(dtype),
        f"bs{block_size}",
        f"h{gqa * num_kv_heads}kv{num_kv_heads}",
        f"d{head_size}",
    ]
    if window:
        parts.append(f"win{window}")
    if logits_soft_cap:
        parts.append(f"cap{logits_soft_cap:g}")
    if not causal:
        parts.append("noncausal")
    name = "-".join(parts)
    return AttentionCase(
        name=name,
        mix=mix,
        dtype=dtype,
        block_size=block_size,
        num_heads=gqa * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        query_lens=tuple(q_lens),
        seq_lens=tuple(s_lens),
        sliding_window=window,
        logits_soft_cap=logits_soft_cap,
        causal=causal,
        seed=sum(name.encode()) % 9973,
    )


def _extra_cases() -> list[AttentionCase]:
    return [
        make_case("mixed", torch.float16, 16, 4, 64, None, logits_soft_cap=1.5),
        make_case("prefill", torch.bfloat16, 32, 1, 64, None, causal=False),
        make_case("mixed", torch.float16, 32, 4, 128, 32, causal=False),
        make_case("decode", torch.float16, 16, 8, 128, None, num_kv_heads=1),
    ]


def _edge_cases() -> list[AttentionCase]:
    """Prefill/chunked cases at tile edges (`EDGE_MIXES`); the first three are in the quick
    set. Pages of 16 and 32 (several per key tile), 64 (one), 128 (a tile is half a page)
    and 24 (tiles straddle pages: one block-table entry per key); head sizes 64, 128 and
    256 (each with its own tiles, `_triton_prefill.prefill_launch_config`)."""
    return [
        make_case("edges", torch.float16, 16, 4, 64, None),
        make_case("chunked", torch.bfloat16, 128, 4, 128, None),
        make_case("edges", torch.bfloat16, 16, 2, 256, None),
        make_case("chunked", torch.float16, 32, 8, 64, 100),
        make_case("edges", torch.bfloat16, 64, 1, 128, 32),
        make_case("longchunk", torch.float16, 16, 4, 64, 400),
        make_case("longchunk", torch.bfloat16, 24, 4, 64, None),
        make_case("chunked", torch.float16, 16, 4, 64, None, causal=False),
        make_case("chunked", torch.float16, 64, 4, 64, None, logits_soft_cap=2.0),
        make_case("edges", torch.float16, 32, 8, 128, None, num_kv_heads=1),
    ]


def conformance_cases(quick: bool) -> Iterator[AttentionCase]:
    """The cases; see the module docstring."""
    if quick:
        mixes = list(BATCH_MIXES)
        for i in range(6):
            yield make_case(
                mixes[i % 3],
                DTYPES[i % 2],
                BLOCK_SIZES[i % 3],
                GQA_RATIOS[(i + i // 3) % 3],
                HEAD_SIZES[(i // 3) % 2],
                WINDOWS[(i // 2) % 2],
            )
        yield from _extra_cases()[:2]
        yield from _edge_cases()[:3]
        return
    for mix, dtype, bs, gqa, hd, win in itertools.product(
        BATCH_MIXES, DTYPES, BLOCK_SIZES, GQA_RATIOS, HEAD_SIZES, WINDOWS
    ):
        yield make_case(mix, dtype, bs, gqa, hd, win)
    yield from _extra_cases()
    yield from _edge_cases()


def _backend_class(backend_name: str, cfg: AttentionSelectorConfig) -> type[AttentionBackend]:
    from opcore.attention.selector import backend_class

    return backend_class(normalize_name(backend_name))


def case_reasons(backend_name: str, case: AttentionCase, device: torch.device | str) -> list[str]:
    """Why ``backend_name`` cannot run ``case`` on ``device`` (empty: it can)."""
    cfg = case.selector_config(torch.device(device).type)
    try:
        cls = _backend_class(backend_name, cfg)
    except Exception as exc:
        return [f"{type(exc).__name__}: {exc}"]
    return list(cls.validate_configuration(cfg))


@dataclasses.dataclass
class CaseData:
    """Everything one case feeds a backend (CPU tensors, case dtype)."""

    query: torch.Tensor
    keys: list[torch.Tensor]  # per sequence, [seq_len, kv_heads, head_size]
    values: list[torch.Tensor]
    block_table: torch.Tensor
    num_blocks: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    scale: float


def make_case_data(case: AttentionCase) -> CaseData:
    """Random inputs and a shuffled block table for ``case`` (deterministic per case)."""
    gen = torch.Generator().manual_seed(case.seed)
    bs = case.block_size
    need = [math.ceil(n / bs) for n in case.seq_lens]
    width = max(need) + 1  # one spare column: entries past a sequence's need are never read
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros((len(need), width), dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        table[i, :n] = perm[used : used + n]
        used += n
        table[i, n:] = perm[-1]  # a block nobody writes: still NaN when read by mistake
    total_q = sum(case.query_lens)
    query = torch.randn((total_q, case.num_heads, case.head_size), generator=gen).to(case.dtype)
    keys = [
        torch.randn((n, case.num_kv_heads, case.head_size), generator=gen).to(case.dtype)
        for n in case.seq_lens
    ]
    values = [
        torch.randn((n, case.num_kv_heads, case.head_size), generator=gen).to(case.dtype)
        for n in case.seq_lens
    ]
    starts = [0]
    for n in case.query_lens:
        starts.append(starts[-1] + n)
    return CaseData(
        query=query,
        keys=keys,
        values=values,
        block_table=table,
        num_blocks=num_blocks,
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(case.seq_lens, dtype=torch.int32),
        scale=case.head_size**-0.5,
    )


def run_backend(
    cls: type[AttentionBackend], case: AttentionCase, data: CaseData, device, dtype: torch.dtype
) -> torch.Tensor:
    """Write the case's context into a fresh NaN-filled cache of ``cls`` in two steps
    (the earlier context, then the new tokens mixed with padding rows of slot -1 and NaN
    data) and run the batch. Returns the output on the CPU."""
    device = torch.device(device)
    impl = cls(
        case.num_heads,
        case.head_size,
        case.num_kv_heads,
        data.scale,
        sliding_window=case.sliding_window,
        logits_soft_cap=case.logits_soft_cap,
        causal=case.causal,
    )
    cache = cls.allocate_kv_cache(
        data.num_blocks, case.block_size, case.num_kv_heads, case.head_size, dtype, device
    )
    cache.fill_(float("nan"))
    table = data.block_table.to(device)
    bs = case.block_size
    # Step 1: the context that precedes each sequence's new tokens.
    old_k, old_v, old_slots = [], [], []
    for i, (q, n) in enumerate(zip(case.query_lens, case.seq_lens, strict=True)):
        pos = torch.arange(n - q)
        old_slots.append(data.block_table[i, pos // bs].to(torch.int64) * bs + pos % bs)
        old_k.append(data.keys[i][: n - q])
        old_v.append(data.values[i][: n - q])
    slots = torch.cat(old_slots)
    if slots.numel():
        impl.write_kv(
            torch.cat(old_k).to(device, dtype),
            torch.cat(old_v).to(device, dtype),
            cache,
            slots.to(device),
        )
    # Step 2: the new tokens, each followed by a padding row that must be skipped.
    new_slots = compute_slot_mapping(data.query_start_loc, data.seq_lens, data.block_table, bs)
    new_k = torch.cat(
        [
            data.keys[i][n - q :]
            for i, (q, n) in enumerate(zip(case.query_lens, case.seq_lens, strict=True))
        ]
    )
    new_v = torch.cat(
        [
            data.values[i][n - q :]
            for i, (q, n) in enumerate(zip(case.query_lens, case.seq_lens, strict=True))
        ]
    )
    pad = torch.full_like(new_k, float("nan"))
    inter_k = torch.stack([new_k, pad], 1).flatten(0, 1)
    inter_v = torch.stack([new_v, pad], 1).flatten(0, 1)
    inter_slots = torch.stack([new_slots, torch.full_like(new_slots, -1)], 1).flatten()
    impl.write_kv(
        inter_k.to(device, dtype), inter_v.to(device, dtype), cache, inter_slots.to(device)
    )

    metadata = PagedAttentionMetadata.build(
        data.query_start_loc.to(device), data.seq_lens.to(device), table, new_slots.to(device)
    )
    out = impl.forward(data.query.to(device, dtype), cache, metadata)
    return out.cpu()  # waits for the device


def reference_output(case: AttentionCase, data: CaseData | None = None) -> torch.Tensor:
    """``TORCH_NATIVE`` in float64 on the CPU from the case's (rounded) inputs."""
    from opcore.attention.backends.torch_native import TorchNativeBackend

    data = data or make_case_data(case)
    return run_backend(TorchNativeBackend, case, data, "cpu", torch.float64)


def run_case(backend_name: str, case: AttentionCase, device: torch.device | str) -> CaseResult:
    """Compare ``backend_name`` on ``device`` with the float64 reference; see module doc."""
    device = torch.device(device)
    cfg = case.selector_config(device.type)
    cls = _backend_class(backend_name, cfg)
    reasons = cls.validate_configuration(cfg)
    if reasons:
        raise CaseNotSupported(backend_name, case, reasons)
    data = make_case_data(case)
    ref = reference_output(case, data)
    out = run_backend(cls, case, data, device, case.dtype).to(torch.float64)
    atol, rtol = TOLERANCES[case.dtype]
    diff = (out - ref).abs()
    if not torch.isfinite(out).all():
        return CaseResult(math.inf, math.inf, atol, rtol)
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / (atol / rtol + ref.abs())).max()) if diff.numel() else 0.0
    return CaseResult(max_abs, max_rel, atol, rtol)
