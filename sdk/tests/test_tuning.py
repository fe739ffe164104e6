"""Tuning tables and `opcore tune` (docs/tuning.md).

The end-to-end test is a real run in a child process on the CPU under Triton's
interpreter (the interpreter must be on before `opcore.kernels.triton` is first imported):
`opcore tune` over two ops with a small budget, with a planted wrong-but-fast provider the
gate must reject and a slow correct provider the platform lists first, whose buckets the
table must route elsewhere. The table is then loaded, consulted by dispatch and by the
Triton launcher, named by explain, part of the compile cache key, and a stale copy is
ignored with one warning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import opcore.ir  # noqa: F401  (hands the tuning index its sources, as any dispatch does)
from opcore.tuner import gate
from opcore.tuning import buckets, runtime, table

# --------------------------------------------------------------------------- units


def test_token_buckets_are_powers_of_two():
    assert [buckets.token_bucket(t) for t in (1, 2, 3, 4, 5, 4096, 4097)] == [
        0,
        1,
        2,
        2,
        3,
        12,
        13,
    ]
    assert buckets.bucket_tokens(buckets.token_bucket(3000)) == 4096


def test_unseen_buckets_take_the_nearest_tuned_one():
    row = buckets.fill_buckets({0: "t1", 5: "t32", 12: "t4096", 15: "t32k"})
    assert row[0] == "t1" and row[5] == "t32"
    assert row[11] == "t4096"  # 2048 tokens: nearest is 4096
    assert row[14] == "t32k"  # 16384: nearest is 32768
    assert row[3] == "t32"  # 5..8 tokens: 32 (distance 2) over 1 (distance 3)
    assert row[40] == "t32k"


def _doc(**over):
    doc = {
        "format": table.FORMAT,
        "version": table.VERSION,
        "environment": dict.fromkeys(table.ENVIRONMENT_KEYS, None),
        "providers": {},
        "entries": [],
    }
    doc.update(over)
    return doc


@pytest.mark.parametrize(
    "change, message",
    [
        ({"format": "other"}, "'format' is 'other'"),
        ({"version": 99}, "'version' is 99"),
        ({"environment": {}}, "'environment' lacks"),
        ({"entries": [{"op": "rms_norm"}]}, "entries[0].dtype must be a str"),
        (
            {"entries": [{"op": "x", "dtype": "bfloat16", "tokens": 0, "shape": [4]}]},
            "entries[0].tokens must be positive",
        ),
    ],
)
def test_a_malformed_table_is_an_error_naming_the_part(change, message):
    with pytest.raises(table.TuningTableError, match=r"tuning table t\.json: .*") as err:
        table.parse(_doc(**change), source="t.json")
    assert message in str(err.value)


def test_tuning_env_naming_a_missing_file_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv(runtime.ENV, str(tmp_path / "missing.json"))
    with pytest.raises(table.TuningTableError, match="OPCORE_TUNING=.*no such file"):
        runtime.reload()
    monkeypatch.setenv(runtime.ENV, "off")
    assert runtime.reload().mode == "off"


def test_the_gate_rejects_a_wrong_output_and_passes_native():
    from opcore.ir import ops

    x = torch.randn(8, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    ref = gate.reference(ops.rms_norm, (x, w, 1e-6), torch.bfloat16)
    assert gate.check(ref, ops.rms_norm.native(x, w, 1e-6)).ok
    verdict = gate.check(ref, x * w)
    assert not verdict.ok and "ULP > allowed" in verdict.reason


def test_gate_budgets_equal_the_conformance_suites():
    budgets = pytest.importorskip("opcore_conformance.budgets")
    from opcore.ir import all_ops

    for op in all_ops().values():
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            b = budgets.budget_for(op, str(dtype).removeprefix("torch."))
            assert gate.budget(op, dtype) == (b.factor, b.floor_ulps), (op.name, dtype)


# --------------------------------------------------------------------------- end to end
CHILD = r"""
import json, os, sys, time, warnings
import opcore.kernels.triton as kt
assert kt.INTERPRETED, "kernels were not built under the interpreter"
import torch
import opcore.tuning as tuning
from opcore.bench import cases
from opcore.cli import main
from opcore.compile.cache_key import cache_key
from opcore.ir import ops
from opcore.kernels.triton import norm
from opcore.platforms import get_current_platform
from opcore.tuning import table as tt

path = sys.argv[1]


@ops.rms_norm.register_impl("wrong_fast")
def wrong_fast(x, weight, epsilon, variance_size=None):
    return x * weight  # no normalisation: fast and wrong


@ops.rms_norm.register_impl("sleepy")
def sleepy(x, weight, epsilon, variance_size=None):
    time.sleep(0.02)  # correct, and slower than anything else by far
    return ops.rms_norm.native(x, weight, epsilon, variance_size)


# The platform lists the slow provider first: dispatch picks it unless a table says not to.
type(get_current_platform()).get_default_ir_op_priority = lambda self, c: {
    "rms_norm": ["sleepy", "triton", "native"]
}
rc = main(["tune", "--ops", "rms_norm,silu_and_mul", "--tokens", "1,8", "--hidden", "256",
           "--quick", "--budget-s", "90", "--rep-ms", "5", "--out", path])
assert rc == 0, rc
doc = json.load(open(path))
tt.load(path)  # loads as a table
out = {"entries": doc["entries"], "search": doc["search"]}

x, w, eps = cases.build("rms_norm", 8, 256, torch.bfloat16, "cpu", quick=True).args
os.environ["OPCORE_TUNING"] = "off"
tuning.reload()
out["off_provider"] = ops.rms_norm.dispatch(x, w, eps).provider
key_off = cache_key()
os.environ["OPCORE_TUNING"] = path
tuning.reload()
out["on_provider"] = ops.rms_norm.dispatch(x, w, eps).provider
x5 = x[:5].contiguous()  # 5 tokens: a bucket the table was not tuned on
out["unseen_provider"] = ops.rms_norm.dispatch(x5, w, eps).provider
out["explain"] = str(ops.rms_norm.explain(x, w, eps))
out["key_differs"] = cache_key() != key_off
seen = []
real = norm.launch_config
def spy(*a):
    got = real(*a)
    seen.append([a[0], a[1], a[3], None if got is None else dict(got)])
    return got
norm.launch_config = spy
with ops.rms_norm.set_priority(["triton"]):
    ops.rms_norm(x, w, eps)
out["launcher_saw"] = seen
out["lookup"] = dict(tuning.launch_config("rms_norm", "triton", torch.bfloat16, 8, (256,)) or {})
out["info"] = tuning.info()

stale = dict(doc)
stale["providers"] = {k: {p: "0" * 64 for p in v} for k, v in doc["providers"].items()}
stale_path = path + ".stale.json"
json.dump(stale, open(stale_path, "w"))
os.environ["OPCORE_TUNING"] = stale_path
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tuning.reload()
    for _ in range(3):
        ops.rms_norm.dispatch(x, w, eps)
out["stale_warnings"] = [str(c.message) for c in caught
                         if type(c.message).__name__ == "TuningWarning"]
out["stale_provider"] = ops.rms_norm.dispatch(x, w, eps).provider
print("RESULT " + json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    pytest.importorskip("triton")
    path = tmp_path_factory.mktemp("tune") / "table.json"
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "OPCORE_PLATFORM": "cpu",
        "XDG_CACHE_HOME": str(path.parent / "cache"),
    }
    env.pop("OPCORE_TUNING", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT ")), proc.stdout


def test_tune_writes_a_table_with_every_bucket(tuned):
    out, stdout = tuned
    got = {(e["op"], e["tokens"]) for e in out["entries"]}
    assert got == {(op, t) for op in ("rms_norm", "silu_and_mul") for t in (1, 8)}
    assert "table written to" in stdout
    assert out["search"]["timer"] == "host"


def test_the_gate_rejects_the_planted_wrong_provider_before_timing(tuned):
    out, _ = tuned
    for e in (e for e in out["entries"] if e["op"] == "rms_norm"):
        rejected = [r for r in e["rejected"] if r["provider"] == "wrong_fast"]
        assert rejected and "ULP > allowed" in rejected[0]["reason"]
        assert "wrong_fast" not in e["order"] and "wrong_fast" not in e["configs"]
        assert "wrong_fast" not in e["measured"] or not e["measured"]["wrong_fast"]
        # the Triton space was searched: the heuristic and at least one configuration
        assert len(e["measured"]["triton"]) >= 2
        assert e["incumbent"] == "sleepy" and e["order"][0] != "sleepy"


def test_dispatch_follows_the_table_and_explain_says_so(tuned):
    out, _ = tuned
    head = {e["tokens"]: e["order"][0] for e in out["entries"] if e["op"] == "rms_norm"}
    assert out["off_provider"] == "sleepy"
    assert out["on_provider"] == head[8]
    assert out["unseen_provider"] == head[8]  # 5 tokens: the nearest tuned bucket (8)
    assert "from tuning" in out["explain"]
    assert out["key_differs"]


def test_the_triton_launcher_uses_the_tables_configuration(tuned):
    out, _ = tuned
    entry = next(e for e in out["entries"] if e["op"] == "rms_norm" and e["tokens"] == 8)
    assert out["lookup"] == entry["configs"]["triton"]
    assert out["launcher_saw"] == [["rms_norm", "triton", 8, entry["configs"]["triton"]]]
    cov = out["info"]["coverage"]
    assert cov["rms_norm"]["buckets"] == 2 and cov["silu_and_mul"]["dtypes"] == ["bfloat16"]


def test_stale_entries_are_ignored_with_one_warning(tuned):
    out, _ = tuned
    assert len(out["stale_warnings"]) == 1, out["stale_warnings"]
    assert "identity changed" in out["stale_warnings"][0]
    assert out["stale_provider"] == "sleepy"


def _write_other_device_table(path):
    doc = _doc(environment={**runtime.environment(), "device": "another device"})
    path.write_text(json.dumps(doc))


def test_a_found_table_for_another_device_is_skipped_without_a_warning(
    monkeypatch, tmp_path, recwarn
):
    monkeypatch.delenv(runtime.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "opcore" / "tuning").mkdir(parents=True)
    _write_other_device_table(tmp_path / "opcore" / "tuning" / "other.json")
    state = runtime.reload()
    # (the tables installed plugins ship, for their devices, are listed there too)
    mine = [x for x in state.elsewhere if x.startswith(str(tmp_path))]
    assert state.used == [] and len(mine) == 1 and state.stale == []
    assert not [w for w in recwarn if w.category is runtime.TuningWarning]


def test_a_named_table_for_another_device_is_stale_with_one_warning(monkeypatch, tmp_path):
    _write_other_device_table(tmp_path / "other.json")
    monkeypatch.setenv(runtime.ENV, str(tmp_path / "other.json"))
    with pytest.warns(runtime.TuningWarning, match="environment differs") as caught:
        runtime.reload()
    assert len([w for w in caught if w.category is runtime.TuningWarning]) == 1
    monkeypatch.setenv(runtime.ENV, "off")
    runtime.reload()


def test_batch_invariance_holds_one_reduction_config_per_shape():
    from opcore.tuner import search
    from opcore.tuning import space

    name = "tune_test_hold"
    sp = space.LaunchSpace(
        params=("W",),
        default=lambda t, s: {"W": 4},
        candidates=lambda t, s: [{"W": 2}, {"W": 8}],
        check=lambda c, s: None,
        reduction_params=("W",),
    )
    space.register_space("rms_norm", name, sp)

    def entry(tokens, times, best):
        return {
            "op": "rms_norm",
            "dtype": "bfloat16",
            "tokens": tokens,
            "shape": [64],
            "configs": {name: {"W": best}},
            "measured": {name: {f"W={w}": {"median_us": t} for w, t in times.items()}},
        }

    # each bucket alone prefers another W; W=8 has the least total time over both
    entries = [entry(1, {2: 1.0, 8: 1.1}, 2), entry(4096, {2: 9.0, 8: 5.0}, 8)]
    search._hold_reductions(entries)
    assert [e["configs"][name] for e in entries] == [{"W": 8}, {"W": 8}]


def test_reduction_configs_are_left_out_when_batch_invariance_is_required(monkeypatch, tmp_path):
    from opcore.ir import ops
    from opcore.testing.ir import temporary_impl
    from opcore.tuning import space

    name = "tune_test_reduce"
    sp = space.LaunchSpace(
        params=("W",),
        default=lambda t, s: {"W": 4},
        candidates=lambda t, s: [],
        check=lambda c, s: None,
        reduction_params=("W",),
    )
    space.register_space("rms_norm", name, sp)

    def impl(x, weight, epsilon, variance_size=None):
        return ops.rms_norm.native(x, weight, epsilon, variance_size)

    with temporary_impl(ops.rms_norm, name, impl):
        doc = _doc(
            environment=runtime.environment(),
            providers={"rms_norm": {name: ops.rms_norm.identity_hash(name)}},
            entries=[
                {
                    "op": "rms_norm",
                    "dtype": "bfloat16",
                    "tokens": 8,
                    "shape": [64],
                    "order": [],
                    "configs": {name: {"W": 2}},
                }
            ],
        )
        (tmp_path / "t.json").write_text(json.dumps(doc))
        monkeypatch.setenv(runtime.ENV, str(tmp_path / "t.json"))
        runtime.reload()
        assert runtime.launch_config("rms_norm", name, torch.bfloat16, 5, (64,)) == {"W": 2}
        # Left out, and said so in `info`, but not warned about as stale: re-running
        # `opcore tune` would not bring it back (the warning once told users to).
        with warnings.catch_warnings():
            warnings.simplefilter("error", runtime.TuningWarning)
            runtime.reload(required_properties=("batch_invariant",))
        assert runtime.launch_config("rms_norm", name, torch.bfloat16, 5, (64,)) is None
        state = runtime.info()
        assert state["stale"] == []
        assert any("batch_invariant" in s for s in state["excluded_by_required_properties"])
    monkeypatch.setenv(runtime.ENV, "off")
    runtime.reload()


@pytest.mark.parametrize(
    "op",
    [
        "rms_norm",
        "fused_add_rms_norm",
        "silu_and_mul",
        "gelu_and_mul",
        "rotary_embedding",
        "split_qkv_rmsnorm_rope",
    ],
)
def test_the_routers_flat_key_is_the_key_functions(op):
    from opcore.bench import cases

    keyfn, flat = buckets.key_function(op), buckets.flat_key_function(op)
    assert keyfn is not None and flat is not None
    args = cases.build(op, 5, 256, torch.bfloat16, "cpu", quick=True).args
    dtype, tokens, shape = keyfn(*args)
    assert flat(args) == ((dtype, *shape), tokens)
    if op in ("rms_norm", "silu_and_mul"):  # tokens from a 3-d input: rows of the last dim
        x3 = args[0].reshape(1, 5, -1)
        dtype, tokens, shape = keyfn(x3, *args[1:])
        assert flat((x3, *args[1:])) == ((dtype, *shape), tokens) and tokens == 5


# ------------------------------------------------------------- search vs bench timing
DRIFT_CHILD = r"""
import json, time
import torch
from opcore.bench import cases, timing
from opcore.ir import ops
from opcore.platforms import get_current_platform
from opcore.tuner import search

calls = {"drifty": 0}


def _sleep_then_native(seconds):
    def impl(x, weight, epsilon, variance_size=None):
        time.sleep(seconds)
        return ops.rms_norm.native(x, weight, epsilon, variance_size)
    return impl


# The incumbent (listed first by the platform), a real improvement, and a candidate whose
# speed drifts: fast for its first 30 calls (its gate run and its own timing, 24 calls),
# three times slower than the incumbent afterwards, as a clock or a neighbour's load can
# change between two separate measurements.
ops.rms_norm.register_impl("steady")(_sleep_then_native(0.002))
ops.rms_norm.register_impl("quick")(_sleep_then_native(0.0005))


@ops.rms_norm.register_impl("drifty")
def drifty(x, weight, epsilon, variance_size=None):
    calls["drifty"] += 1
    time.sleep(0.0001 if calls["drifty"] <= 30 else 0.006)
    return ops.rms_norm.native(x, weight, epsilon, variance_size)


platform = get_current_platform()
type(platform).get_default_ir_op_priority = lambda self, c: {
    "rms_norm": ["steady", "drifty", "quick", "native"]
}
case = cases.build("rms_norm", 1, 256, torch.bfloat16, "cpu", quick=True)
opts = search.Options(ops=("rms_norm",), tokens=(1,), hidden=(256,), log=lambda s: None)
timer = search.Timer(platform, platform.device(), opts.rep_ms)
out = {}
for providers in (("steady", "drifty"), ("steady", "drifty", "quick")):
    calls["drifty"] = 0
    opts.providers = providers
    entry = search.tune_bucket(ops.rms_norm, case.args, timer, time.perf_counter() + 60, opts)
    # What `opcore bench` then measures for each provider, through its own procedure.
    benched = {}
    for name in providers:
        fn = lambda name=name: ops.rms_norm.impls[name].impl_fn(*case.args)
        s = timing.bench_samples_us(fn, platform, timing.timers(platform, platform.device()),
                                    rep_ms=60)
        benched[name] = timing.spread(s["cpu"]).median_us
    out["+".join(providers)] = {"entry": entry, "benched": benched}
print("RESULT " + json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def drift():
    env = {**os.environ, "OPCORE_PLATFORM": "cpu", "OPCORE_TUNING": "off"}
    proc = subprocess.run(
        [sys.executable, "-c", DRIFT_CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_a_candidate_timed_fast_alone_but_slower_side_by_side_is_not_chosen(drift):
    got = drift["steady+drifty"]
    e = got["entry"]
    # Alone, the drifting candidate looked faster than the incumbent beyond noise ...
    assert e["best"]["drifty"]["median_us"] < 0.5 * e["best"]["steady"]["median_us"]
    assert e["incumbent"] == "steady"
    # ... measured in alternation with it, it lost, and the incumbent kept the head
    verdicts = [c for c in e["confirmations"] if c["provider"] == "drifty"]
    assert verdicts and not verdicts[0]["accepted"] and verdicts[0]["against"] == "incumbent"
    assert e["order"][0] == "steady"
    # the bench's own procedure agrees the rejected candidate is the slower one
    assert got["benched"]["drifty"] > got["benched"]["steady"]


def test_the_search_never_picks_what_the_bench_measures_slower(drift):
    for got in drift.values():
        head, inc = got["entry"]["order"][0], got["entry"]["incumbent"]
        # never slower than the incumbent as `opcore bench` measures them (beyond noise)
        assert got["benched"][head] <= got["benched"][inc] * (1 + 0.2), got["benched"]
    # and a real improvement still wins, after the drifting candidate lost its comparison
    e = drift["steady+drifty+quick"]["entry"]
    assert e["order"][0] == "quick"
    assert [c["provider"] for c in e["confirmations"]] == ["drifty", "quick"]
    assert [c["accepted"] for c in e["confirmations"]] == [False, True]
    assert e["best"]["quick"]["timer"] == "cpu"


# ------------------------------------------------------------------ the router's memo
def test_the_router_memo_answers_as_the_table_per_shape_dtype_and_supports_args(
    monkeypatch, tmp_path
):
    from opcore.ir import ops
    from opcore.platforms import get_current_platform
    from opcore.testing.ir import temporary_impl

    assert buckets.keyed_by_first_arg("rms_norm")

    def noop(x, weight, epsilon, variance_size=None):
        return x

    def routed(x, weight, epsilon, variance_size=None):
        return x

    def contiguous_only(x, weight, epsilon, variance_size=None):
        return x.is_contiguous()

    def accepts(x, weight, epsilon, variance_size=None):
        return True

    cls = type(get_current_platform())
    monkeypatch.setattr(
        cls, "get_default_ir_op_priority", lambda self, c: {"rms_norm": ["t_noop", "t_routed"]}
    )
    with (
        temporary_impl(ops.rms_norm, "t_noop", noop, supports_args=accepts),
        temporary_impl(ops.rms_norm, "t_routed", routed, supports_args=contiguous_only),
    ):
        ids = {p: ops.rms_norm.identity_hash(p) for p in ("t_noop", "t_routed")}
        entry = {"op": "rms_norm", "dtype": "float32", "shape": [64], "configs": {}}
        doc = {
            "format": table.FORMAT,
            "version": table.VERSION,
            "environment": runtime.environment(),
            "providers": {"rms_norm": ids},
            "entries": [
                {**entry, "tokens": 1, "order": ["t_noop", "t_routed"]},
                {**entry, "tokens": 4, "order": ["t_routed", "t_noop"]},
            ],
        }
        path = tmp_path / "table.json"
        path.write_text(json.dumps(doc))
        monkeypatch.setenv(runtime.ENV, str(path))
        runtime.reload()
        try:
            w = torch.ones(64)

            def pick(x):
                return ops.rms_norm.dispatch(x, w, 1e-6).provider

            wide = torch.randn(4, 128)
            cases = [
                (torch.randn(4, 64), "t_routed"),
                (torch.randn(1, 64), "t_noop"),  # its bucket keeps the order
                (torch.randn(4, 64), "t_routed"),  # a memo hit
                (torch.randn(1, 4, 64), "t_routed"),  # 3-d: 4 tokens, another memo key
                (torch.randn(4, 32), "t_noop"),  # a shape the table has no entry for
                (torch.randn(4, 64, dtype=torch.float64), "t_noop"),  # another dtype
                (wide[:, :64], "t_noop"),  # same shape and dtype; supports_args says no
                (torch.randn(4, 64), "t_routed"),  # the memo holds no supports_args verdict
            ]
            for _ in range(2):
                assert [pick(x) for x, _ in cases] == [want for _, want in cases]
            # the eager call goes the same way
            x = torch.randn(4, 64)
            assert ops.rms_norm(x, w, 1e-6) is x
        finally:
            monkeypatch.setenv(runtime.ENV, "off")
            runtime.reload()
