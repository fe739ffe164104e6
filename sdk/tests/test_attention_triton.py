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
        skip_decode_rows=True, interpret=True)
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
