"""TRITON_PAGED against TORCH_NATIVE under ``TRITON_INTERPRET=1`` (real Triton, on the
CPU interpreter; small shapes because the interpreter is slow). The variable must be set
before Triton is imported, so the kernels run in a fresh interpreter."""

from __future__ import annotations

import json
import textwrap

from opcore.testing.distributions import run_python

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from opcore.attention import testing as T
    from opcore.attention import PagedAttentionMetadata
    from opcore.attention.backends.triton_paged import TritonPagedBackend as B

    out = {"cases": {}, "errors": {}}
    cases = list(T.conformance_cases(quick=True))
    for case in cases:
        r = T.run_case("TRITON_PAGED", case, "cpu")
        out["cases"][case.name] = [r.max_abs_err, r.max_rel_err, r.rtol, r.passed]
    # The split-KV decode path with its merge kernel (forced: the interpreter has no SMs),
    # including splits that end up empty under a sliding window, and in mixed batches
    # (decode rows split, the other rows in the prefill kernel).
    B.num_splits = 3
    for case in cases:
        if case.mix in ("decode", "mixed"):
            r = T.run_case("TRITON_PAGED", case, "cpu")
            out["cases"]["split3-" + case.name] = [r.max_abs_err, r.max_rel_err, r.rtol, r.passed]
    B.num_splits = None
    # The earlier mixed kernel, kept for bench/attention_prefill.py.
    B.prefill_path = "legacy"
    for case in cases:
        if case.mix == "edges":
            r = T.run_case("TRITON_PAGED", case, "cpu")
            out["cases"]["legacy-" + case.name] = [r.max_abs_err, r.max_rel_err, r.rtol, r.passed]
    B.prefill_path = "paged_prefill"

    # A mixed batch splits its rows: the prefill kernel, told to skip decode rows, writes
    # only the others, and they match the whole forward; the decode rows stay untouched.
    from opcore.attention.backends import _triton_prefill as P
    case = next(c for c in cases if c.mix == "chunked")
    data = T.make_case_data(case)
    impl = B(case.num_heads, case.head_size, case.num_kv_heads, data.scale)
    cache = B.allocate_kv_cache(
        data.num_blocks, case.block_size, case.num_kv_heads, case.head_size, case.dtype, "cpu")
    cache.normal_()
    md = PagedAttentionMetadata.build(data.query_start_loc, data.seq_lens, data.block_table)
    q = data.query.to(case.dtype)
    full = impl.forward(q, cache, md)
    part = torch.full_like(q, float("nan"))
    P.launch_prefill(
        query=q, key_cache=cache[0], value_cache=cache[1], out=part, metadata=md,
        num_heads=case.num_heads, num_kv_heads=case.num_kv_heads, head_size=case.head_size,
        qk_scale=data.scale * 1.4426950408889634, window=1 << 30, softcap=0.0, causal=True,
        skip_decode_rows=True, interpret=True,
        short_context=P.short_context_tiles(case.head_size, md.max_seq_len))  # as the plan
    decode_row = torch.zeros(q.shape[0], dtype=torch.bool)
    for i, n in enumerate(md.query_lens_host):
        if n == 1:
            decode_row[data.query_start_loc[i]] = True
    out["split"] = {
        "decode_rows": int(decode_row.sum()),
        "decode_rows_untouched": bool(part[decode_row].isnan().all()),
        "other_rows_equal": bool(torch.equal(part[~decode_row], full[~decode_row])),
        "num_decode_seqs": md.num_decode_seqs,
    }

    impl = B(4, 64, 2, 0.125)
    cache = B.allocate_kv_cache(4, 16, 2, 64, torch.float16, "cpu")
    k = torch.randn(2, 2, 64).half()
    def md(seq_len, table):
        return PagedAttentionMetadata.build(
            torch.tensor([0, 1]), torch.tensor([seq_len]), torch.tensor(table))

    for name, fn in {
        "slot": lambda: impl.write_kv(k, k, cache, torch.tensor([3, 64])),
        "table": lambda: impl.forward(torch.randn(1, 4, 64).half(), cache, md(40, [[0, 1]])),
        "heads": lambda: impl.forward(torch.randn(1, 8, 64).half(), cache, md(4, [[0]])),
    }.items():
        try:
            fn()
            out["errors"][name] = None
        except ValueError as exc:
            out["errors"][name] = str(exc)
    print(json.dumps(out))
    """
)


def test_triton_paged_matches_torch_native_in_the_interpreter():
    proc = run_python(SCRIPT, env={"TRITON_INTERPRET": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    cases = result["cases"]
    # Every batch mix, the tile-edge prefill/chunked cases, the forced split path (also in
    # mixed batches), the legacy prefill kernel, and the soft-cap/non-causal cases ran.
    assert {name.split("-")[0] for name in cases} == {
        "decode",
        "prefill",
        "mixed",
        "edges",
        "chunked",
        "split3",
        "legacy",
    }
    assert any(n.startswith("split3-mixed") for n in cases)
    assert any("cap" in n for n in cases) and any("noncausal" in n for n in cases)
    bad = {n: r for n, r in cases.items() if not r[3]}
    assert not bad, bad
    assert result["split"] == {
        "decode_rows": 1,
        "decode_rows_untouched": True,
        "other_rows_equal": True,
        "num_decode_seqs": 1,
    }
    errors = result["errors"]
    assert errors["slot"].startswith(
        "slot_mapping[1]=64 is out of range: the kv cache holds 64 slots"
    )
    assert errors["table"].startswith("block_table is too short: sequence 0 has seq_lens[0]=40")
    assert errors["heads"].startswith("TRITON_PAGED: query must have shape [num_tokens, 4, 64]")


def test_triton_paged_imports_and_explains_itself_without_triton():
    code = """
        import sys, torch

        class NoTriton:
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoTriton())
        from opcore.attention import AttentionSelectorConfig
        from opcore.attention.backends.triton_paged import TritonPagedBackend
        cfg = AttentionSelectorConfig(
            head_size=128, num_heads=8, num_kv_heads=8, device_type="cuda"
        )
        print(TritonPagedBackend.validate_configuration(cfg))
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "['triton is not installed']"


MIXED_INVARIANCE = textwrap.dedent(
    """
    import json, torch
    from opcore.attention import PagedAttentionMetadata
    from opcore.attention.backends.triton_paged import TritonPagedBackend as B

    # Decode rows, whole prompts and chunks over a cached prefix, each sequence run alone
    # and inside mixed batches: with the fixed split count TRITON_PAGED declares
    # batch_invariant, so every sequence's rows must keep their bits.
    g = torch.Generator().manual_seed(5)
    ctx = [70, 129, 150, 1, 64, 97]
    q_lens = [1, 129, 33, 1, 64, 2]  # decode, prompt past a tile, chunk, ...
    pages = [(n + 15) // 16 for n in ctx]
    cache = B.allocate_kv_cache(sum(pages), 16, 2, 64, torch.bfloat16, "cpu")
    cache.copy_(torch.randn(cache.shape, generator=g).to(torch.bfloat16))
    perm = torch.randperm(sum(pages), generator=g).to(torch.int32)
    table = torch.zeros(len(ctx), max(pages), dtype=torch.int32)
    used = 0
    for i, n in enumerate(pages):
        table[i, :n] = perm[used:used + n]
        used += n
    queries = [torch.randn(n, 4, 64, generator=g).to(torch.bfloat16) for n in q_lens]
    impl = B(4, 64, 2, 0.125)
    impl.num_splits = 4
    declared = sorted(impl.declared_properties())

    def run(rows):
        starts = [0]
        for r in rows:
            starts.append(starts[-1] + q_lens[r])
        md = PagedAttentionMetadata.build(torch.tensor(starts, dtype=torch.int32),
                                          torch.tensor([ctx[r] for r in rows], dtype=torch.int32),
                                          table[rows].contiguous())
        out = impl.forward(torch.cat([queries[r] for r in rows]), cache, md)
        return [out[starts[i]:starts[i + 1]] for i in range(len(rows))]

    alone = {r: run([r])[0] for r in range(len(ctx))}
    mismatched = []
    for rows in ([2, 0, 1], [5, 4, 3, 2, 1, 0], [1, 3, 5]):
        for r, got in zip(rows, run(rows)):
            if not torch.equal(got, alone[r]):
                mismatched.append([rows, r])
    print(json.dumps({"declared": declared, "mismatched": mismatched}))
    """
)


def test_triton_paged_mixed_batches_keep_each_sequences_bits_in_the_interpreter():
    # Issue 29's property re-check for the prefill path: the property the backend declares
    # with a fixed split count holds when prompts, chunks and decode rows share a batch.
    proc = run_python(MIXED_INVARIANCE, env={"TRITON_INTERPRET": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "batch_invariant" in result["declared"]
    assert result["mismatched"] == []


# A paged cache whose spare slots hold NaN (only each context's slots hold numbers), with
# a shuffled block table: shared by the child scripts below.
NAN_PAGED = textwrap.dedent(
    """
    import torch
    from opcore.attention.backends.triton_paged import TritonPagedBackend as B


    def nan_paged(ctx, page, kv, head, g):
        pages = [(n + page - 1) // page for n in ctx]
        cache = B.allocate_kv_cache(sum(pages) + 1, page, kv, head, torch.bfloat16, "cpu")
        cache.fill_(float("nan"))
        perm = torch.randperm(sum(pages) + 1, generator=g).to(torch.int32)
        table = torch.zeros(len(ctx), max(pages), dtype=torch.int32)
        used = 0
        for i, (n, c) in enumerate(zip(pages, ctx)):
            table[i, :n] = perm[used:used + n]
            used += n
            for j in range(c):
                blk, slot = int(table[i, j // page]), j % page
                cache[:, blk, slot] = torch.randn(2, kv, head, generator=g).to(torch.bfloat16)
        return cache, table
    """
)

KV_DESCRIPTORS = NAN_PAGED + textwrap.dedent(
    """
    import json, torch
    from opcore.attention import PagedAttentionMetadata
    from opcore.attention.backends import _triton_prefill as P
    from opcore.attention.backends.triton_paged import TritonPagedBackend as B

    # Key tiles read through tensor descriptors (pages of 64 and 128 keys) against the
    # pointer kernel with the same tiles: a prompt past a tile, a chunk over a prefix and a
    # decode row in one batch, spare slots NaN, a head size that pads (96 -> 128), and
    # the sliding-window / soft-cap / non-causal variants.
    g = torch.Generator().manual_seed(7)
    out = {"equal": {}, "finite": {}, "auto": {}, "backend_equal": {}}
    for page, head in ((64, 64), (128, 96), (64, 128)):
        ctx, q_lens = [130, 150, 70], [130, 33, 1]
        cache, table = nan_paged(ctx, page, 2, head, g)
        q = torch.randn(sum(q_lens), 4, head, generator=g).to(torch.bfloat16)
        starts = torch.tensor([0, 130, 163, 164], dtype=torch.int32)
        md = PagedAttentionMetadata.build(starts, torch.tensor(ctx, dtype=torch.int32), table)
        for name, window, cap, causal in (("causal", 1 << 30, 0.0, True),
                                          ("window-cap", 40, 20.0, True),
                                          ("noncausal", 50, 0.0, False)):
            res = []
            for tma in (False, True):
                o = torch.zeros_like(q)
                P.launch_prefill(
                    query=q, key_cache=cache[0], value_cache=cache[1], out=o, metadata=md,
                    num_heads=4, num_kv_heads=2, head_size=head, qk_scale=head ** -0.5 * 1.4427,
                    window=window, softcap=cap, causal=causal, skip_decode_rows=True,
                    interpret=True, launch=P.PrefillLaunch(128, 64, 4, 3, kv_tma=tma))
                res.append(o)
            key = f"page{page}-head{head}-{name}"
            out["equal"][key] = bool(torch.equal(res[0], res[1]))
            out["finite"][key] = bool(res[1][:163].isfinite().all())
        # The backend asks for descriptors: its prefill takes them where the page allows.
        out["auto"][page] = P.prefill_launch_config(head, torch.bfloat16, page, True).kv_tma
        impl = B(4, head, 2, head ** -0.5)
        impl.prefill_kv_descriptors = True
        impl.num_splits = 4  # batch-invariant: no short-context tiles, descriptors kept
        forced = torch.zeros_like(q)
        P.launch_prefill(
            query=q, key_cache=cache[0], value_cache=cache[1], out=forced, metadata=md,
            num_heads=4, num_kv_heads=2, head_size=head, qk_scale=head ** -0.5 * 1.4426950408889634,
            window=1 << 30, softcap=0.0, causal=True, skip_decode_rows=True, interpret=True,
            # 4 heads x 2 row tiles over the interpreter's 132 stand-in multiprocessors.
            launch=P.prefill_launch_config(head, torch.bfloat16, page, True, 8 / 132))
        got = impl.forward(q, cache, md)
        out["backend_equal"][page] = bool(torch.equal(got[:163], forced[:163]))
    out["pages16_auto"] = P.prefill_launch_config(128, torch.bfloat16, 16, True).kv_tma
    out["few_tiles_rows"] = P.prefill_launch_config(128, torch.bfloat16, 128, True, 1.9).block_m
    out["many_tiles_rows"] = P.prefill_launch_config(128, torch.bfloat16, 128, True, 2.0).block_m
    out["no_descriptors_auto"] = P.prefill_launch_config(128, torch.bfloat16, 128, False).kv_tma
    cache = B.allocate_kv_cache(4, 16, 2, 64, torch.bfloat16, "cpu").zero_()
    md = PagedAttentionMetadata.build(torch.tensor([0, 20], dtype=torch.int32),
                                      torch.tensor([20], dtype=torch.int32),
                                      torch.tensor([[0, 1]], dtype=torch.int32))
    q = torch.zeros(20, 4, 64, dtype=torch.bfloat16)
    try:
        P.launch_prefill(
            query=q, key_cache=cache[0], value_cache=cache[1], out=torch.empty_like(q),
            metadata=md, num_heads=4, num_kv_heads=2, head_size=64, qk_scale=0.18,
            window=1 << 30, softcap=0.0, causal=True, skip_decode_rows=False, interpret=True,
            launch=P.PrefillLaunch(128, 64, 4, 3, kv_tma=True))
        out["forced_error"] = None
    except ValueError as exc:
        out["forced_error"] = str(exc)
    print(json.dumps(out))
    """
)


def test_triton_paged_prefill_reads_key_tiles_through_descriptors_in_the_interpreter():
    # Issue 29: where a page holds whole key tiles, the prefill kernel reads K and V tiles
    # through tensor descriptors (one hardware copy each on devices whose platform says
    # so). It must compute exactly what the pointer kernel does with the same tiles, and a
    # whole page read must not let the NaN of spare slots into the result.
    proc = run_python(KV_DESCRIPTORS, env={"TRITON_INTERPRET": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["equal"] and all(result["equal"].values()), result["equal"]
    assert all(result["finite"].values()), result["finite"]
    assert result["auto"] == {"64": True, "128": True}
    assert result["backend_equal"] == {"64": True, "128": True}
    assert result["pages16_auto"] is False and result["no_descriptors_auto"] is False
    # Fewer than two 128-row programs per multiprocessor (a short chunk): 64-row tiles.
    assert (result["few_tiles_rows"], result["many_tiles_rows"]) == (64, 128)
    assert result["forced_error"].endswith(
        "needs a page size that is a multiple of BLOCK_N (got 16) and caches `tma_ready` accepts"
    )


SHORT_CONTEXT = NAN_PAGED + textwrap.dedent(
    """
    import json, torch
    from opcore.attention import PagedAttentionMetadata
    from opcore.attention.backends import _triton_prefill as P

    # Head size 128: a batch whose contexts are all short (<= P.SHORT_CONTEXT keys) runs
    # the short-context tiles, one with a longer context the others; the two batches have
    # the same shapes (one call signature), so only the plan tells their launches apart.
    g = torch.Generator().manual_seed(11)
    long_ctx = P.SHORT_CONTEXT + 6
    cache, table = nan_paged([40, long_ctx], 16, 2, 128, g)
    starts = torch.tensor([0, 40, 43], dtype=torch.int32)
    q = torch.randn(43, 4, 128, generator=g).to(torch.bfloat16)
    batches = {"short": [40, P.SHORT_CONTEXT], "long": [40, long_ctx]}
    out = {"plan": {}, "equal": {}, "invariant": {}}
    impl = B(4, 128, 2, 128 ** -0.5)
    for name, ctx in batches.items():
        md = PagedAttentionMetadata.build(starts, torch.tensor(ctx, dtype=torch.int32), table)
        got = impl.forward(q, cache, md)
        (plan,) = md.checked_cache().values()
        out["plan"][name] = plan.short_context
        forced = torch.zeros_like(q)
        P.launch_prefill(
            query=q, key_cache=cache[0], value_cache=cache[1], out=forced, metadata=md,
            num_heads=4, num_kv_heads=2, head_size=128, qk_scale=128 ** -0.5 * P.LOG2E,
            window=1 << 30, softcap=0.0, causal=True, skip_decode_rows=False, interpret=True,
            launch=P.prefill_launch_config(128, torch.bfloat16, 16,
                                           short_context=name == "short"))
        out["equal"][name] = bool(torch.equal(got, forced))
    # A backend that declares batch invariance (fixed split count) keeps one tile: the
    # 40-token prompt keeps its bits alone and beside the long context.
    fixed = B(4, 128, 2, 128 ** -0.5)
    fixed.num_splits = 4
    out["declared"] = sorted(fixed.declared_properties())
    alone_md = PagedAttentionMetadata.build(starts[:2], torch.tensor([40], dtype=torch.int32),
                                            table[:1].contiguous())
    alone = fixed.forward(q[:40], cache, alone_md)
    md = PagedAttentionMetadata.build(starts, torch.tensor(batches["long"], dtype=torch.int32),
                                      table)
    beside = fixed.forward(q, cache, md)[:40]
    (plan,) = alone_md.checked_cache().values()
    out["invariant"] = {"plan": plan.short_context, "equal": bool(torch.equal(alone, beside))}
    print(json.dumps(out))
    """
)


def test_triton_paged_prefill_tiles_follow_the_batchs_longest_context_in_the_interpreter():
    # The 64 x 32 tiles adopted for head size 128 on 2026-12-07 suit short contexts only:
    # on an H100 chunks over 4k-33k prefixes ran 11-32 % slower on them than on 64 x 64
    # (bench/results/2026-12-07-h100-session17). The plan holds the choice, so a replay
    # bound for a short batch must not serve a long one of the same shapes; a backend that
    # declares batch invariance keeps one tile for every batch.
    proc = run_python(SHORT_CONTEXT, env={"TRITON_INTERPRET": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["plan"] == {"short": True, "long": False}
    assert result["equal"] == {"short": True, "long": True}
    assert "batch_invariant" in result["declared"]
    assert result["invariant"] == {"plan": False, "equal": True}


def test_prefill_kernel_does_not_specialise_on_the_cache_row_count():
    # The cache's row count (read only by the descriptor path) changes with the cache's
    # block count; specialised on, a cache of 5 or 6 blocks of 24 keys (120 or 144 rows,
    # one divisible by 16) would compile the kernel twice.
    from opcore.attention.backends import _triton_prefill as P

    unspecialised = {p.name for p in P.paged_prefill_kernel.params if p.do_not_specialize}
    assert {"cache_rows", "num_seqs", "block_size", "window"} <= unspecialised


PACKED_GQA = NAN_PAGED + textwrap.dedent(
    """
    import json, torch
    from opcore.attention import PagedAttentionMetadata
    from opcore.attention.backends import _triton_prefill as P

    # A tile's rows as tokens x the query heads of one kv head (groups of 2, 3 and 8: the
    # last row block of a group of 3 ends masked; each also with the output's rows worked
    # out after the key loop),
    # against one query head per program with the same key tiles; prompts past a tile, a
    # chunk over a prefix and a decode row in one batch, spare slots NaN, with and without
    # a sliding window. Then the tile's sequence found by the vector scan against the
    # binary search (more sequences than one scan holds take the search).
    g = torch.Generator().manual_seed(11)
    out = {"close": {}, "finite": {}, "scan_equal": {}}

    def launch(q, cache, md, heads, kv, head, cfg, window=1 << 30):
        o = torch.zeros_like(q)
        P.launch_prefill(
            query=q, key_cache=cache[0], value_cache=cache[1], out=o, metadata=md,
            num_heads=heads, num_kv_heads=kv, head_size=head, qk_scale=head ** -0.5 * 1.4427,
            window=window, softcap=0.0, causal=True, skip_decode_rows=True, interpret=True,
            launch=cfg)
        return o

    # The last chunk starts at position 11: with groups of 3 (21 tokens a tile) the token
    # just past the first tile sits on a key tile's first key (32), which a row past the
    # group's last whole token would compute without.
    ctx, q_lens = [130, 150, 70, 75], [130, 33, 1, 64]
    starts = torch.tensor([0, 130, 163, 164, 228], dtype=torch.int32)
    for heads, kv in ((4, 2), (6, 2), (8, 1)):
        cache, table = nan_paged(ctx, 16, kv, 64, g)
        md = PagedAttentionMetadata.build(starts, torch.tensor(ctx, dtype=torch.int32), table)
        q = torch.randn(228, heads, 64, generator=g).to(torch.bfloat16)
        rows = torch.cat([torch.arange(0, 163), torch.arange(164, 228)])  # not the decode row
        for window in (1 << 30, 45):
            one = launch(q, cache, md, heads, kv, 64, P.PrefillLaunch(64, 32, 4, 2), window)
            packed = launch(q, cache, md, heads, kv, 64,
                            P.PrefillLaunch(64, 32, 4, 2, pack_gqa=True), window)
            key = f"{heads}/{kv}-window{window}"
            out["close"][key] = float((packed[rows].float() - one[rows].float()).abs().max())
            out["finite"][key] = bool(packed[rows].isfinite().all())
            out["decode_row_untouched"] = bool((packed[163] == 0).all())
            # The output's rows worked out again after the key loop (packed or not).
            variants = {"late": dict(pack_gqa=True, late_rows=True)}
            if heads == 6:
                variants["late-unpacked"] = dict(late_rows=True)
            for name, kw in variants.items():
                got = launch(q, cache, md, heads, kv, 64, P.PrefillLaunch(64, 32, 4, 2, **kw),
                             window)
                out["close"][f"{key}-{name}"] = float(
                    (got[rows].float() - one[rows].float()).abs().max())
                out["finite"][f"{key}-{name}"] = bool(got[rows].isfinite().all())
                out["variants_leave_the_decode_row"] = out.get(
                    "variants_leave_the_decode_row", True) and bool((got[163] == 0).all())
    # 70 one-token-and-more sequences: over SEQ_SCAN, so the binary search runs.
    for n_seqs in (3, P.SEQ_SCAN + 6):
        lens = [2 + (7 * i) % 19 for i in range(n_seqs)]
        cache, table = nan_paged(lens, 16, 2, 64, g)
        st = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)
        md = PagedAttentionMetadata.build(st, torch.tensor(lens, dtype=torch.int32), table)
        q = torch.randn(sum(lens), 4, 64, generator=g).to(torch.bfloat16)
        scan = launch(q, cache, md, 4, 2, 64, P.PrefillLaunch(32, 32, 4, 2, pack_gqa=True))
        search = launch(q, cache, md, 4, 2, 64,
                        P.PrefillLaunch(32, 32, 4, 2, pack_gqa=True, seq_scan=False))
        out["scan_equal"][n_seqs] = bool(torch.equal(scan, search))
        out["scan_finite"] = bool(scan.isfinite().all())
    print(json.dumps(out))
    """
)


def test_triton_paged_prefill_packs_a_kv_heads_query_heads_into_one_tile_in_the_interpreter():
    # Issue 29: rows of a tile are tokens x the query heads that share one kv head, so each
    # K/V tile serves the whole group and the causal diagonal spans fewer tokens. Every
    # row must compute what one query head per program computes with the same key tiles
    # (up to the product's summation order), groups that do not divide the tile included;
    # and the vector scan that finds a tile's sequence must agree with the binary search.
    proc = run_python(PACKED_GQA, env={"TRITON_INTERPRET": "1"}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # each layout and window, with late rows, and the group of 3 unpacked with late rows
    assert len(result["close"]) == 6 + 6 + 2
    assert max(result["close"].values()) <= 1.6e-2, result["close"]
    assert all(result["finite"].values()), result["finite"]
    assert result["decode_row_untouched"] is True
    assert result["variants_leave_the_decode_row"] is True
    # The same tiles and rows, only the store's offsets recomputed: the same bits.
    assert all(v == 0.0 for k, v in result["close"].items() if k.endswith("late-unpacked"))
    assert result["scan_equal"] == {"3": True, str(64 + 6): True}
    assert result["scan_finite"] is True


class _TwoGenerationHostStandIn:
    """Stands in for a host with two GPU generations (no machine here has one): device 1
    copies tensor-descriptor tiles in hardware, device 0 does not."""

    def tensor_descriptor_copies(self, index: int = 0) -> bool:
        return index == 1


def test_prefill_descriptors_are_decided_per_device_not_from_device_0(monkeypatch):
    # A backend serving device 1 took device 0's answer when the choice was made once on
    # construction (the review of 2026-12-06). It must ask about the query's device.
    import torch

    from opcore.attention.backends import triton_paged

    monkeypatch.setattr(triton_paged, "get_current_platform", _TwoGenerationHostStandIn)
    impl = triton_paged.TritonPagedBackend(4, 64, 2, 0.125)
    assert impl.prefill_kv_descriptors is None  # nothing decided before a device is seen
    assert impl.kv_descriptors_on(torch.device("cuda", 1)) is True
    assert impl.kv_descriptors_on(torch.device("cuda", 0)) is False
    assert impl.kv_descriptors_on(torch.device("cpu")) is False  # no index: device 0's
    impl.prefill_kv_descriptors = True  # forced: every device
    assert impl.kv_descriptors_on(torch.device("cuda", 0)) is True


def test_prefill_launch_packs_query_heads_where_the_pack_sweep_chose_it():
    # bench/results/2026-12-06-h100-prefill-pack: packed on every descriptor launch and the
    # pointer launches above head size 64; head size 64's 128 x 128 pointer tiles not.
    import torch

    from opcore.attention.backends import _triton_prefill as P

    cfg = P.prefill_launch_config
    assert (
        cfg(128, torch.bfloat16, 128, True).pack_gqa and cfg(128, torch.bfloat16, 128, True).kv_tma
    )
    assert cfg(128, torch.bfloat16, 128, True, 1.0).pack_gqa  # the 64-row descriptor tiles
    assert cfg(256, torch.float16, 64, True).pack_gqa
    assert cfg(128, torch.bfloat16, 16, True) == P.PrefillLaunch(
        64, 64, 4, 2, pack_gqa=True, late_rows=True
    )
    assert cfg(256, torch.bfloat16, 16) == P.PrefillLaunch(128, 64, 8, 2, pack_gqa=True)
    assert cfg(64, torch.bfloat16, 16) == P.PrefillLaunch(128, 128, 4, 3, late_rows=True)
    assert all(cfg(h, torch.bfloat16, 16).seq_scan for h in (64, 128, 256))


def test_prefill_launch_takes_narrow_key_tiles_for_short_contexts_at_head_size_128():
    # bench/results/2026-12-07-h100-session17: 64 x 32 pointer tiles on every page size
    # where no context passes SHORT_CONTEXT keys (16 x 1024: 10-13 % ahead of the
    # descriptor tiles with 32/8 and 64/8 heads); 64 x 64 (or descriptors) past it.
    import torch

    from opcore.attention.backends import _triton_prefill as P

    cfg = P.prefill_launch_config
    short = P.PrefillLaunch(64, 32, 4, 2, pack_gqa=True, late_rows=True)
    for head in (96, 128):
        for page in (16, 64, 128):
            assert cfg(head, torch.bfloat16, page, True, short_context=True) == short
            assert cfg(head, torch.float16, page, False, 1.0, short_context=True) == short
    assert cfg(128, torch.bfloat16, 128, True).kv_tma  # a long context keeps descriptors
    assert cfg(128, torch.float32, 16, short_context=True).block_n == 16
    for head in (64, 256):  # their tiles do not change
        for page in (16, 128):
            assert cfg(head, torch.bfloat16, page, True, short_context=True) == cfg(
                head, torch.bfloat16, page, True
            )
    assert P.short_context_tiles(128, P.SHORT_CONTEXT)
    assert not P.short_context_tiles(128, P.SHORT_CONTEXT + 1)
    assert P.short_context_tiles(80, 1) and not P.short_context_tiles(64, 1)
    assert not P.short_context_tiles(256, 1)


def test_prefill_launch_works_out_the_output_rows_late_where_the_rows_sweep_chose_it():
    # bench/results/2026-12-06-h100-late-rows: on the 128-row descriptor tiles and the
    # pointer tiles of head sizes 64 and 128; not on head size 256's pointer tiles (slower
    # there) or the 64-row descriptor tiles (not swept).
    import torch

    from opcore.attention.backends import _triton_prefill as P

    cfg = P.prefill_launch_config
    assert cfg(128, torch.bfloat16, 128, True).late_rows
    assert cfg(256, torch.float16, 64, True).late_rows
    assert cfg(128, torch.bfloat16, 16).late_rows
    assert not cfg(256, torch.bfloat16, 16).late_rows
    assert cfg(64, torch.bfloat16, 128, True).late_rows
    assert cfg(64, torch.bfloat16, 16).late_rows
    assert not cfg(128, torch.bfloat16, 128, True, 1.0).late_rows
