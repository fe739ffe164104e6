"""Provider properties of attention backends (docs/properties.md), on decode batches (one
new token per sequence) and on mixed batches (``-mixed`` cases: a third of the sequences
decode one token, a third prefill their whole prompt, a third a chunk over a cached
prefix), a "row" being a sequence's new tokens:

``attention.batch_invariance[<backend>-<variant>-<dtype>]``
    64 sequences of context 1 to 700 share one paged KV cache; 8 of them are decoded alone,
    then inside batches of 3, 32 and 64 (at other positions, among other sequences); each
    output must be bitwise equal to the one decoded alone. Quick mode: 16 sequences of
    context up to 1200 (long enough for split-KV to split), 4 alone, batches of 3, 8 and
    16. Mixed: 24 sequences of context 2 to 400, 6 alone, batches of 3, 12 and 24 (quick:
    9 up to 300, 3 alone, batches of 3 and 9).
``attention.determinism[...]``
    the whole batch three times, bitwise equal.
``attention.capture_safety[...]``
    after warm-up, the forward of the full batch is captured (``Platform.capture_graph``),
    new query and cache values are written into the captured buffers and the graph is
    replayed; its output is compared with an eager forward on the new values (bitwise when
    the backend declares ``deterministic``). ``not_applicable`` without graphs.

The backends are the platform's candidates for the decode configuration; each is checked
in every variant of `AttentionBackend.property_variants` (``TRITON_PAGED``: automatic and
fixed KV split counts) against what that variant's `declared_properties` says, with the
same verdicts as the op checks (`opcore_conformance.checks.properties.verdict`).
"""

from __future__ import annotations

from typing import Any

import torch

from opcore_conformance import status as S
from opcore_conformance.case import Case, CheckFailed, NotApplicable, Unsupported, case_id
from opcore_conformance.checks.properties import capture, verdict
from opcore_conformance.tensors import bitwise_equal, compare

OP = "attention"
BATCH = "attention.batch_invariance"
DETERMINISM = "attention.determinism"
CAPTURE = "attention.capture_safety"
CHECKS = (BATCH, DETERMINISM, CAPTURE)

# (sequences in the cache, longest context, probes run alone, batch sizes), by mix and quick
SIZES = {
    ("decode", True): (16, 1200, 4, (3, 8, 16)),
    ("decode", False): (64, 700, 8, (3, 32, 64)),
    ("mixed", True): (9, 300, 3, (3, 9)),
    ("mixed", False): (24, 400, 6, (3, 12, 24)),
}
MIXES = ("decode", "mixed")
HEADS, KV_HEADS, HEAD, BLOCK = 8, 2, 128, 16
SEED = 0xA77


def collect(ctx) -> list[Case]:
    wanted = [c for c in CHECKS if ctx.wants(check=c)]
    if not wanted or not ctx.wants(op=OP):
        return []
    try:
        from opcore.attention.selector import backend_class
        from opcore.attention.selector_config import AttentionSelectorConfig
    except ImportError as exc:
        return [
            Case(
                case_id(c),
                c,
                op=OP,
                preset=S.NOT_APPLICABLE,
                preset_reason=f"opcore.attention is not importable: {exc}",
            )
            for c in wanted
        ]
    claimed = [d for d in (torch.bfloat16, torch.float16) if d in ctx.platform.supported_dtypes]
    out: list[Case] = []
    for dtype in claimed[:1]:
        cfg = AttentionSelectorConfig(
            head_size=HEAD,
            num_heads=HEADS,
            num_kv_heads=KV_HEADS,
            dtype=dtype,
            block_size=BLOCK,
            device_type=ctx.platform.device_type,
        )
        for name in ctx.platform.get_attn_backend_candidates(cfg):
            try:
                cls = backend_class(name)
                reasons = list(cls.validate_configuration(cfg))
                variants = cls.property_variants()
            except Exception as exc:
                reasons, variants = [f"{type(exc).__name__}: {exc}"], {"default": {}}
                cls = None
            dname = str(dtype).removeprefix("torch.")
            for variant, settings in variants.items():
                for mix in MIXES:
                    for check in wanted:
                        c = Case(
                            case_id(check, name, variant, dname, None if mix == "decode" else mix),
                            check,
                            op=OP,
                            provider=name,
                            dtype=dname,
                            sample=variant if mix == "decode" else f"{variant}-{mix}",
                            body=_body(check, cls, name, variant, settings, dtype, mix),
                        )
                        if reasons:
                            c.preset = S.UNSUPPORTED
                            c.preset_reason = (
                                f"{name} declines the decode case: {'; '.join(reasons)}"
                            )
                        out.append(c)
    return out


class _Batch:
    """A shared paged cache holding ``sequences`` sequences (`SIZES`) and each sequence's
    new tokens (one for ``mix == "decode"``; for ``"mixed"``, by index modulo 3: one, the
    whole context, or a chunk of 2 to context - 1 over a cached prefix), and batches of
    them over it."""

    def __init__(
        self, impl: Any, cls: Any, dtype: torch.dtype, device: Any, quick: bool, mix: str
    ) -> None:
        g = torch.Generator().manual_seed(SEED)
        self.impl, self.device, self.dtype = impl, device, dtype
        self.sequences, longest, self.probes, self.batch_sizes = SIZES[(mix, bool(quick))]
        low = 1 if mix == "decode" else 3
        self.lens = torch.randint(low, longest, (self.sequences,), generator=g)
        need = [(int(n) + BLOCK - 1) // BLOCK for n in self.lens]
        width = max(need)
        perm = torch.randperm(sum(need), generator=g)
        table = torch.zeros((self.sequences, width), dtype=torch.int32)
        used = 0
        for i, n in enumerate(need):
            table[i, :n] = perm[used : used + n]
            used += n
        self.table = table.to(device)
        self.cache = cls.allocate_kv_cache(sum(need), BLOCK, KV_HEADS, HEAD, dtype, device)
        self.cache.copy_(torch.randn(self.cache.shape, generator=g).to(dtype))
        self.q_lens = [1] * self.sequences
        if mix == "mixed":  # decode, whole prompt, chunk over a prefix, by index modulo 3
            for i, n in enumerate(self.lens.tolist()):
                if i % 3 == 1:
                    self.q_lens[i] = n
                elif i % 3 == 2:
                    self.q_lens[i] = int(torch.randint(2, n, (1,), generator=g))
        self.starts = [0]
        for n in self.q_lens:
            self.starts.append(self.starts[-1] + n)
        shape = (self.starts[-1], HEADS, HEAD)
        self.query = torch.randn(shape, generator=g).to(dtype).to(device)
        self.generator = g

    def rows_of(self, rows: list[int]) -> list[int]:
        """The token indices of sequences ``rows``, in order."""
        return [t for r in rows for t in range(self.starts[r], self.starts[r + 1])]

    def metadata(self, rows: list[int]) -> Any:
        from opcore.attention.paged import PagedAttentionMetadata

        index = torch.tensor(rows)
        starts = [0]
        for r in rows:
            starts.append(starts[-1] + self.q_lens[r])
        return PagedAttentionMetadata.build(
            torch.tensor(starts, dtype=torch.int32).to(self.device),
            self.lens.index_select(0, index).to(torch.int32).to(self.device),
            self.table.index_select(0, index.to(self.device)),
        )

    def run(self, rows: list[int], meta: Any = None, query: Any = None) -> torch.Tensor:
        """The backend's forward over sequences ``rows`` (their new tokens, in order). With
        ``query`` and ``meta`` given (the capture check) it runs the forward alone: no host
        tensor is made or copied to the device, so a capture failure is the backend's own."""
        if query is None:
            query = self.query.index_select(0, torch.tensor(self.rows_of(rows), device=self.device))
        return self.impl.forward(
            query, self.cache, meta if meta is not None else self.metadata(rows)
        )

    def part(self, out: torch.Tensor, rows: list[int], pos: int) -> torch.Tensor:
        """The output rows of the sequence at position ``pos`` of batch ``rows``."""
        first = sum(self.q_lens[r] for r in rows[:pos])
        return out[first : first + self.q_lens[rows[pos]]]

    def describe(self, seq: int) -> str:
        n, q = int(self.lens[seq]), self.q_lens[seq]
        kind = "decode" if q == 1 else "prompt" if q == n else f"chunk of {q}"
        return f"sequence {seq} (context {n}, {kind})"


def _body(
    check: str, cls: Any, name: str, variant: str, settings: dict, dtype: torch.dtype, mix: str
):
    def body(ctx, _tol) -> dict[str, Any]:
        if cls is None:
            raise Unsupported(f"{name} did not load")
        impl = cls(HEADS, HEAD, KV_HEADS, HEAD**-0.5)
        for attr, value in settings.items():
            setattr(impl, attr, value)
        declared = frozenset(impl.declared_properties())
        who = f"attention backend {name} ({variant}, {mix} batches)"
        data = _Batch(impl, cls, dtype, ctx.device, ctx.quick, mix)
        try:
            if check == BATCH:
                return _batch_invariance(ctx, data, declared, who)
            if check == DETERMINISM:
                return _determinism(ctx, data, declared, who)
            return _capture(ctx, data, declared, who)
        except (CheckFailed, NotApplicable, Unsupported):
            raise
        except Exception as exc:
            raise CheckFailed(f"{who} raised {type(exc).__name__}: {exc}") from None

    return body


def _batch_invariance(ctx, data: _Batch, declared, who: str) -> dict[str, Any]:
    g = data.generator
    order = torch.randperm(data.sequences, generator=g).tolist()
    if any(q > 1 for q in data.q_lens):  # mixed: decode, prompt and chunk probes in turn
        kinds = [[s for s in order if s % 3 == k] for k in range(3)]
        order = [s for trio in zip(*kinds, strict=False) for s in trio]
    probes = order[: data.probes]
    alone = {p: data.run([p]) for p in probes}
    bad, checked = [], 0
    for batch in data.batch_sizes:
        k = min(batch, data.probes)
        rest = [s for s in torch.randperm(data.sequences, generator=g).tolist() if s not in probes]
        rows = rest[: batch - k]
        where = sorted(torch.randperm(batch, generator=g)[:k].tolist())
        for pos, p in zip(where, probes[:k], strict=True):
            rows.insert(pos, p)
        out = data.run(rows)
        for pos, p in zip(where, probes[:k], strict=True):
            checked += 1
            if not bitwise_equal(data.part(out, rows, pos), alone[p]):
                bad.append(f"{data.describe(p)} in a batch of {batch}")
    ctx.platform.synchronize()
    return verdict(
        "batch_invariant" in declared,
        "batch_invariant",
        not bad,
        who,
        f"{len(bad)} of {checked} sequences differ from the sequence run alone, "
        f"e.g. {'; '.join(bad[:3])}",
        {"sequences_checked": checked, "mismatched": len(bad)},
    )


def _determinism(ctx, data: _Batch, declared, who: str) -> dict[str, Any]:
    rows = list(range(data.sequences))
    meta = data.metadata(rows)
    outs = [data.run(rows, meta).clone() for _ in range(3)]
    ctx.platform.synchronize()
    same = all(bitwise_equal(outs[0], o) for o in outs[1:])
    return verdict(
        "deterministic" in declared,
        "deterministic",
        same,
        who,
        "three runs of the same batch gave different bits",
        {"runs": 3},
    )


def _capture(ctx, data: _Batch, declared, who: str) -> dict[str, Any]:
    rows = list(range(data.sequences))
    meta = data.metadata(rows)
    query = data.query.clone()
    holder: dict[str, Any] = {}

    def step() -> None:
        holder["out"] = data.run(rows, meta, query)

    replay = capture(ctx, step, declared, who, "its forward")
    g = data.generator
    query.copy_(torch.randn(query.shape, generator=g).to(query.dtype))
    data.cache.copy_(torch.randn(data.cache.shape, generator=g).to(data.cache.dtype))
    replay()
    ctx.platform.synchronize()
    replayed = holder["out"].clone()
    eager = data.run(rows, meta, query)
    ctx.platform.synchronize()
    exact = "deterministic" in declared
    if exact:
        holds = bitwise_equal(replayed, eager)
        metrics: dict[str, Any] = {"compared": "bitwise"}
    else:
        m = compare(replayed, eager, 1e-2, 1e-2)
        holds = not m["mismatched"]
        metrics = {"compared": "atol=rtol=1e-2", "max_ratio": m["max_ratio"]}
    return verdict(
        "capture_safe" in declared,
        "capture_safe",
        holds,
        who,
        f"the replayed forward differs from an eager one on the new values ({metrics['compared']})",
        metrics,
    )
