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
    # including splits that end up empty under a sliding window.
    B.num_splits = 3
    for case in cases:
        if case.mix == "decode":
            r = T.run_case("TRITON_PAGED", case, "cpu")
            out["cases"]["split3-" + case.name] = [r.max_abs_err, r.max_rel_err, r.rtol, r.passed]
    B.num_splits = None

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
    # Every batch mix, the forced split path, and the extra soft-cap/non-causal cases ran.
    assert {name.split("-")[0] for name in cases} == {"decode", "prefill", "mixed", "split3"}
    assert any("cap" in n for n in cases) and any("noncausal" in n for n in cases)
    bad = {n: r for n, r in cases.items() if not r[3]}
    assert not bad, bad
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
