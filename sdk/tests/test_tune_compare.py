"""bench/tune_compare.py's plumbing on the CPU, over real `opcore bench --jsonl` records:
rows split into tuned and unseen by the table, opcore against the best peer (within 3 %,
at or ahead), a missing input and a line cut short reported instead of a crash, and the
FlagGems peer skipped on the host CPU with its reason. Timings are not checked
(performance is measured by benchmarks, not tests)."""

from __future__ import annotations

import json
from pathlib import Path

from opcore.bench import baselines
from opcore.cli import main
from opcore.testing import scripts

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "tune_compare.py"


def load_script():
    return scripts.load_script(SCRIPT)


def bench_jsonl(tmp_path: Path, name: str, providers: str) -> Path:
    out = tmp_path / f"{name}.jsonl"
    rc = main(["bench", "--quick", "--device", "cpu", "--ops", "rms_norm", "--tokens", "1,3",
               "--providers", providers, "--out", str(tmp_path / name),
               "--jsonl", str(out)])  # fmt: skip
    assert rc == 0
    return out


def test_compare_splits_rows_and_judges_them_against_the_best_peer(tmp_path):
    tc = load_script()
    off = bench_jsonl(tmp_path, "off", "native")
    on = bench_jsonl(tmp_path, "on", "native,F.rms_norm,flaggems")
    # a step stopped mid-line: its last record is cut short
    text = on.read_text()
    on.write_text(text + text.splitlines()[-1][:40])
    table = {
        "environment": {"device": "cpu"},
        "search": {"spent_s": 1.0, "budget_s": 2.0},
        "entries": [
            {"op": "rms_norm", "shape": [256], "tokens": 1, "dtype": "bfloat16",
             "configs": {}, "rejected": []},
        ],
    }  # fmt: skip
    report, summary = tc.compare(
        table, [str(off)], [str(on), str(tmp_path / "never.jsonl")], ("F.rms_norm",), "native"
    )
    recs = [json.loads(line) for line in text.splitlines()]
    t = {(r["provider"], r["tokens"]): r["cpu_us"] for r in recs if r.get("cpu_us")}
    rows = {(r["kind"], r["tokens"]): r for r in summary["rows"]}
    assert set(rows) == {("tuned", 1), ("unseen", 3)}
    for (_kind, tokens), row in rows.items():
        ratio = t[("native", tokens)] / t[("F.rms_norm", tokens)]
        assert row["peer"] == "F.rms_norm"
        assert abs(row["ratio"] - ratio) < 1e-9
        assert row["within"] == (ratio <= 1.03) and row["ahead"] == (ratio <= 1.0)
        assert ("cause" in row) == (ratio > 1.0)
    assert summary["tuned"]["rows"] == 1 and summary["unseen"]["rows"] == 1
    assert "never.jsonl: not written" in report
    assert "cut short" in report
    # FlagGems' kernels need an accelerator: skipped with the reason, listed in the report
    assert "rms_norm / flaggems: FlagGems' Triton kernels need an accelerator" in report


def test_compare_without_any_input_still_writes_a_report(tmp_path, capsys):
    tc = load_script()
    table_path = tmp_path / "t.json"
    table_path.write_text(json.dumps({"entries": [], "search": {}}))
    out = tmp_path / "compare.md"
    rc = tc.main(["--table", str(table_path), "--off", str(tmp_path / "a.jsonl"),
                  "--on", str(tmp_path / "b.json"), "--out", str(out)])  # fmt: skip
    assert rc == 0
    text = out.read_text()
    assert "a.jsonl: not written" in text and "b.json: not written" in text
    assert "no row has both opcore and a peer measured" in text


def test_flaggems_is_a_known_peer_of_the_ops_it_has_kernels_for():
    assert "flaggems" in baselines.known_names(["rms_norm"])
    assert "flaggems" not in baselines.known_names(["split_qkv_rmsnorm_rope"])


def test_a_noisy_device_time_hands_the_row_to_graph_replay():
    tc = load_script()

    def rec(tokens, device_iqr):
        return {"tokens": tokens, "device_us": 10.0, "graph_us": 8.0,
                "device_spread": {"iqr_over_median": device_iqr},
                "graph_spread": {"iqr_over_median": 0.0}}  # fmt: skip

    assert tc.row_timer([rec(4096, 0.02), rec(4096, 0.05)]) == "device"
    assert tc.row_timer([rec(4096, 0.02), rec(4096, 0.4)]) == "graph"  # one noisy: all move
    assert tc.row_timer([rec(32, 0.4), rec(32, 0.0)]) == "graph"  # decode sizes: replay
    no_graph = {"tokens": 4096, "device_us": 9.0, "device_spread": {"iqr_over_median": 0.4}}
    assert tc.row_timer([rec(4096, 0.02), no_graph]) == "device"  # nothing to move to
    assert tc.time_of(rec(4096, 0.4), "graph") == 8.0


def test_a_jsonl_written_twice_is_read_as_its_last_run(tmp_path):
    # `opcore bench --jsonl` appends; a warm device machine kept a file from an earlier call,
    # and the report mixed both runs under the first run's date.
    tc = load_script()
    path = tmp_path / "off.jsonl"
    first = bench_jsonl(tmp_path, "a", "native")
    second = bench_jsonl(tmp_path, "b", "native,F.rms_norm")
    path.write_text(first.read_text() + second.read_text())
    records, env, problem = tc.read_records(str(path))
    want = [json.loads(line) for line in second.read_text().splitlines()]
    assert records == want[1:] and env == want[0]["environment"]
    assert problem == f"{path}: holds 2 runs (appended to); only the last is read"


def test_a_row_behind_timed_in_one_round_says_opcore_was_timed_first(tmp_path):
    # One round times opcore's providers before the peers (`opcore bench`), so a reading of
    # a row behind says so; rows timed in rotated rounds (`--rounds`) do not.
    tc = load_script()
    causes = {}
    for rounds in (1, 2):
        out = tmp_path / f"r{rounds}.jsonl"
        rc = main(["bench", "--quick", "--device", "cpu", "--ops", "rms_norm", "--tokens", "3",
                   "--providers", "native,F.rms_norm", "--rounds", str(rounds),
                   "--out", str(tmp_path / f"r{rounds}"), "--jsonl", str(out)])  # fmt: skip
        assert rc == 0
        rows, _env, problems, _failed = tc.collect([str(out)])
        assert not problems
        (row,) = rows.values()
        causes[rounds] = tc.likely_cause(row["native"], None, row["F.rms_norm"], None, "native")
    assert "one round, opcore timed before the peers" in causes[1]
    assert "one round" not in causes[2]
