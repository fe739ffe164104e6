"""`opcore bench` runs on the CPU, on a platform without timing events (vdev) and, through
the `Platform`'s methods, with device timers; it writes its JSON and Markdown outputs
(timings are not checked: performance is measured by benchmarks, never by tests)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from opcore.bench import cases, metadata, timing
from opcore.cli import main


def test_bench_quick_on_cpu_writes_reports(tmp_path):
    rc = main(
        [
            "bench",
            "--quick",
            "--device",
            "cpu",
            "--ops",
            "rms_norm,split_qkv_rmsnorm_rope",
            "--tokens",
            "1,3",
            "--providers",
            "native,F.rms_norm",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    got = {(r["op"], r["tokens"], r["provider"]) for r in result["records"]}
    assert got == {
        ("rms_norm", 1, "native"),
        ("rms_norm", 3, "native"),
        ("rms_norm", 1, "F.rms_norm"),
        ("rms_norm", 3, "F.rms_norm"),
        ("split_qkv_rmsnorm_rope", 1, "native"),
        ("split_qkv_rmsnorm_rope", 3, "native"),
    }
    assert all(r["cpu_us"] > 0 for r in result["records"])
    assert result["environment"]["torch"]
    md = (tmp_path / "bench.md").read_text()
    assert "| rms_norm | H=256 | 3 | F.rms_norm |" in md


def test_bench_quick_records_spread_metadata_and_plots(tmp_path, capsys):
    """The acceptance run of `opcore bench --quick` on the CPU: JSON, Markdown and PNG, each
    time with its spread, the run's metadata, and torch's thread count pinned then
    restored."""
    before = torch.get_num_threads()
    rc = main(["bench", "--quick", "--device", "cpu", "--ops", "rms_norm", "--tokens", "1,4",
               "--providers", "native,F.rms_norm", "--threads", "1", "--out", str(tmp_path),
               "--jsonl", str(tmp_path / "bench.jsonl")])  # fmt: skip
    assert rc == 0
    assert torch.get_num_threads() == before  # restored after the run
    out = capsys.readouterr().out
    assert "torch threads 1 (pinned by --threads)" in out
    result = json.loads((tmp_path / "bench.json").read_text())
    env = result["environment"]
    assert env["torch_threads"] == 1 and env["threads_pinned"] == "pinned by --threads"
    assert len(env["load_average_start"]) == 3 and len(env["load_average_end"]) == 3
    assert env["platform"] == "cpu" and env["device_type"] == "cpu"
    assert env["plugins"]["opcore-plugin-cpu"]  # the installed distribution's version
    assert env["opcore"] and env["torch"] == torch.__version__ and "triton" in env
    from opcore.ir import ops

    native_id = ops.rms_norm.identity_hash("native")
    assert env["provider_identity"]["rms_norm"]["native"] == native_id
    assert env["copy_gbs"] > 0 and env["copy_timer"] == "host"
    for r in result["records"]:
        s = r["cpu_spread"]
        assert s["min_us"] <= s["p25_us"] <= s["median_us"] <= s["p75_us"]
        assert s["median_us"] == r["cpu_us"] and s["reps"] >= 3
        assert r["torch_threads"] == 1 and "load_1m" in r
        assert r["identity"] == (native_id if r["provider"] == "native" else None)
        assert r["cpu_pct_copy"] > 0
    f_rms = next(r for r in result["records"] if r["provider"] == "F.rms_norm")
    if f_rms.get("speedup_vs_native_cpu") is not None:
        lo, hi = f_rms["speedup_vs_native_cpu_range"]
        assert lo <= f_rms["speedup_vs_native_cpu"] <= hi
    else:  # the spread of one side made the ratio meaningless, and the record says so
        assert "IQR/median" in f_rms["speedup_vs_native_cpu_unusable"]
    assert result["plots"] == {"time": {"file": "bench.png"},
                               "pct_copy": {"file": "bench_pct_copy.png"}}  # fmt: skip
    for name in ("bench.png", "bench_pct_copy.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "bench.md").read_text()
    assert "- torch threads: 1 (pinned by --threads)" in md
    assert "opcore-plugin-cpu" in md and "load average (1, 5, 15 min):" in md
    assert f"  - rms_norm: native `{native_id[:16]}`" in md.split("| op |")[0]  # the header
    assert "| host µs (p25–p75) | min µs | reps |" in md
    assert "![time](bench.png)" in md
    lines = (tmp_path / "bench.jsonl").read_text().splitlines()
    header, *records = [json.loads(x) for x in lines]
    assert header["type"] == "header" and header["environment"]["torch_threads"] == 1
    assert [r["provider"] for r in records] == ["native", "F.rms_norm"] * 2


def test_bench_rejects_unknown_provider_names(tmp_path, capsys):
    """A typo in --providers used to give an empty table and exit 0."""
    rc = main(["bench", "--quick", "--device", "cpu", "--ops", "rms_norm",
               "--providers", "native,tritn", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "argument --providers: unknown provider 'tritn' for op(s) rms_norm on platform" in err
    assert "'native'" in err and "'compile'" in err and "'F.rms_norm'" in err  # the valid ones
    assert "'native,'" not in err and not (tmp_path / "bench.json").exists()


def test_bench_rejects_a_peer_that_applies_to_none_of_the_ops(tmp_path, capsys):
    rc = main(["bench", "--quick", "--device", "cpu", "--ops", "silu_and_mul",
               "--providers", "F.rms_norm", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown provider 'F.rms_norm' for op(s) silu_and_mul on platform" in err
    assert "'F.rms_norm'" not in err.split("choose from")[1]


def test_bench_rejects_unknown_op_names(tmp_path, capsys):
    rc = main(["bench", "--quick", "--device", "cpu", "--ops", "rms_norm,rms_nrom",
               "--out", str(tmp_path)])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "argument --ops: unknown op 'rms_nrom' (choose from 'rms_norm'," in err


def test_bench_refuses_a_thread_count_below_one(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--quick", "--threads", "0", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "--threads: expected a positive integer, got '0'" in capsys.readouterr().err


def test_spread_is_order_statistics_of_the_samples():
    s = timing.spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.min_us, s.p25_us, s.median_us, s.p75_us, s.reps) == (1.0, 2.0, 3.0, 4.0, 5)
    assert s.rel_iqr == 2.0 / 3.0
    assert timing.spread([7.0]).rel_iqr == 0.0
    with pytest.raises(ValueError, match="no samples"):
        timing.spread([])


def _rec(provider, p25, med, p75):
    spread = timing.Spread(p25, p25, med, p75, 10).as_dict()
    return {"op": "rms_norm", "layout": "H=8", "tokens": 1, "provider": provider,
            "cpu_us": med, "cpu_spread": spread}  # fmt: skip


def test_speedups_come_from_medians_with_their_spread():
    from opcore.bench import runner

    native, fast = _rec("native", 9.0, 10.0, 11.0), _rec("triton", 4.5, 5.0, 5.5)
    runner._speedups([native, fast])
    assert fast["speedup_vs_native_cpu"] == 2.0
    assert fast["speedup_vs_native_cpu_range"] == [9.0 / 5.5, 11.0 / 4.5]


def test_a_noisy_baseline_gives_no_speedup_but_says_why():
    """A baseline whose samples range over more than its median (one reading 16 ms among
    40 µs ones) must not turn into a "x1000" speedup."""
    from opcore.bench import report, runner

    native, fast = _rec("native", 40.0, 60.0, 16000.0), _rec("triton", 4.5, 5.0, 5.5)
    runner._speedups([native, fast])
    assert fast["speedup_vs_native_cpu"] is None
    assert fast["speedup_vs_native_cpu_unusable"].startswith("native IQR/median")
    assert "n/a: native IQR/median" in report.markdown(
        {"environment": {}, "records": [native, fast]}
    )
    (warning,) = runner.spread_warnings([native, fast])
    assert warning.startswith("large spread: rms_norm H=8 T=1 native (cpu): IQR/median")


def test_a_busy_host_is_warned_about():
    from opcore.bench import runner

    busy = {"logical_cpus": 2, "load_average_start": [1.0, 1, 1], "load_average_end": [5.5, 2, 1]}
    (line,) = runner.load_warnings(busy)
    assert line.startswith("host busy: 1-minute load average 5.50 over the 2 logical CPUs")
    quiet = {**busy, "load_average_end": [1.5, 1, 1]}
    assert runner.load_warnings(quiet) == []
    assert runner.load_warnings({"logical_cpus": 2, "load_average_start": None}) == []


def test_pinned_threads_restores_the_count_even_on_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with metadata.pinned_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="positive integer"):
        with metadata.pinned_threads(0):
            pass
    assert 1 <= metadata.default_threads() <= metadata.DEFAULT_MAX_THREADS


def test_case_bytes_follow_the_byte_model():
    c = cases.build("fused_add_rms_norm", 4, 256, __import__("torch").bfloat16, "cpu", quick=True)
    assert c.nbytes == (4 * 4 + 1) * 256 * 2  # read x, r; write out, residual; weight once
    s = cases.build("silu_and_mul", 2, 256, __import__("torch").float32, "cpu", quick=True)
    assert s.args[0].shape == (2, 1024) and s.nbytes == 3 * 2 * 512 * 4


def test_bench_decode_attention_on_cpu(tmp_path):
    rc = main(["bench", "--decode-attention", "--device", "cpu", "--batches", "2",
               "--contexts", "64", "--rep-ms", "1", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    result = json.loads((tmp_path / "attention.json").read_text())
    (record,) = result["records"]
    assert record["provider"] == "TORCH_NATIVE"  # the selector's choice on the cpu platform
    assert (record["batch"], record["context"]) == (2, 64)
    assert record["kv_bytes"] == 2 * 2 * 64 * 8 * 128 * 2  # K and V, bf16, once
    assert record["max_abs_err_vs_sdpa"] < 1e-2
    assert "TORCH_NATIVE B=   2 ctx=    64" in (tmp_path / "attention.md").read_text()


BENCH = "import sys; from opcore.cli import main; sys.exit(main(sys.argv[1:]))"


def test_bench_runs_on_a_platform_without_timing_events(tmp_path):
    """The virtual device (vdev): not the cpu, no timing events, so each call is timed on
    the host clock with the platform's synchronize; the environment is the platform's."""
    from opcore.testing import run_python

    proc = run_python(
        BENCH,
        env={"OPCORE_VDEV": "1"},
        args=["bench", "--quick", "--ops", "rms_norm", "--tokens", "2", "--providers",
              "native", "--out", str(tmp_path)],
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "bench.json").read_text())
    env = result["environment"]
    assert (env["platform"], env["device_type"], env["timers"]) == ("vdev", "vdev", "host")
    assert env["device"] == "opcore virtual device (vdev)"  # from Platform.device_summary
    (record,) = result["records"]
    assert record["cpu_us"] > 0 and "device_us" not in record


def test_bench_refuses_a_device_of_another_platform(tmp_path, capsys):
    rc = main(["bench", "--quick", "--device", "meta", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'meta' is not a device of the current platform" in err[0]
    assert not (tmp_path / "bench.json").exists()


class HostClockEvent:
    """Stands in for a device's timing event (no device with events here): the host clock."""

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def test_device_timers_use_the_platform_methods_with_stand_in_events(tmp_path):
    """The device-timer path of the runner, on a platform stand-in whose timing events and
    graphs are host-side (this machine has no device with events): every device call goes
    through the Platform (timing_event, capture_graph, synchronize, empty_cache)."""
    from opcore.bench import report, runner
    from opcore.platforms.interface import UnspecifiedPlatform

    calls = {"synchronize": 0, "empty_cache": 0, "capture_graph": 0}

    class EventStandInPlatform(UnspecifiedPlatform):
        name = "event-stand-in"

        def timing_event(self):
            return HostClockEvent()

        def capture_graph(self, fn):
            calls["capture_graph"] += 1
            return fn  # "replaying" runs the captured calls again

        def synchronize(self):
            calls["synchronize"] += 1

        def empty_cache(self):
            calls["empty_cache"] += 1

    opts = runner.Options(
        ops=("rms_norm",),
        tokens=(2,),
        hidden=(256,),
        providers={"native"},
        dtype=torch.float32,
        quick=True,
        rep_ms=1,
        copy_bytes=1 << 20,
    )
    result = runner.run(opts, log=lambda line: None, platform=EventStandInPlatform())
    env = result["environment"]
    assert env["timers"] == "device" and env["copy_gbs"] > 0
    (record,) = result["records"]
    assert record["device_us"] > 0 and record["graph_us"] > 0
    assert record["device_pct_copy"] > 0 and record["graph_pct_copy"] > 0
    assert calls["capture_graph"] == 1 and calls["empty_cache"] == 1
    assert calls["synchronize"] >= 3
    for timer in ("device", "graph"):
        s = record[f"{timer}_spread"]
        assert s["reps"] >= 3 and s["min_us"] <= s["median_us"] == record[f"{timer}_us"]
    # the stand-in's device is the host cpu, so the default thread count is pinned
    assert env["torch_threads"] == metadata.default_threads()
    paths = report.write_all(result, str(tmp_path))
    md = (tmp_path / "bench.md").read_text()
    assert "| device µs (p25–p75) | graph µs (p25–p75) | reps |" in md
    assert paths["json"] and paths["png"]


def _bench_cli(args: list[str], env: dict[str, str] | None = None):
    """``opcore bench ARGS`` in a fresh interpreter, as a user runs it."""
    from opcore.testing import run_python

    return run_python(BENCH, env=env, args=["bench", *args], timeout=300)


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("device", ["nonsense", "vdev"])
def test_bench_refuses_a_device_name_torch_does_not_know_in_one_line(tmp_path, device):
    """``--device nonsense`` (a typo), or ``--device vdev`` without OPCORE_VDEV=1 (a platform
    that is not loaded), used to end in torch.device's RuntimeError traceback and exit 1."""
    out = tmp_path / "out"
    line = _one_error_line(_bench_cli(["--quick", "--device", device, "--out", str(out)]))
    assert line.startswith(
        f"opcore bench: error: argument --device: device {device!r} is not a device torch "
        f"knows in this process; the current platform 'cpu' has device type 'cpu'"
    ), line
    assert "OPCORE_VDEV=1 for vdev" in line
    assert not out.exists()  # refused before anything ran or was written


def test_bench_refuses_a_device_index_the_platform_does_not_have(tmp_path):
    out = tmp_path / "out"
    proc = _bench_cli(["--quick", "--device", "vdev:3", "--out", str(out)], {"OPCORE_VDEV": "1"})
    line = _one_error_line(proc)
    assert line == (
        "opcore bench: error: argument --device: device 'vdev:3' does not exist: the "
        "current platform 'vdev' has 1 device(s) here"
    )
    assert not out.exists()


@pytest.mark.parametrize("decode_attention", [False, True])
def test_bench_refuses_an_out_that_is_a_file_before_measuring(tmp_path, decode_attention):
    """``--out FILE`` used to measure the whole run, then lose it to FileExistsError."""
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    extra = ["--decode-attention"] if decode_attention else []
    args = ["--quick", "--device", "cpu", "--ops", "rms_norm", "--tokens", "1",
            "--providers", "native", *extra, "--jsonl", str(tmp_path / "r.jsonl")]  # fmt: skip
    line = _one_error_line(_bench_cli([*args, "--out", str(mine)]))
    assert line == (
        f"opcore bench: error: argument --out: {str(mine)!r} exists and is not a directory "
        f"(the reports go into a directory)"
    )
    assert mine.read_text() == "mine"  # untouched
    assert not (tmp_path / "r.jsonl").exists()  # nothing was measured
    line = _one_error_line(_bench_cli([*args, "--out", str(mine / "sub")]))
    assert line == (
        f"opcore bench: error: argument --out: {str(mine / 'sub')!r} cannot be a directory: "
        f"{str(mine)!r} is not a directory"
    )


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "x"])
def test_bench_refuses_a_rep_ms_that_is_not_a_positive_integer(tmp_path, value):
    """``--rep-ms 0`` and ``-5`` used to be accepted (argparse's int)."""
    proc = _bench_cli(["--quick", "--rep-ms", value, "--out", str(tmp_path / "out")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"opcore bench: error: argument --rep-ms: expected a positive integer, got {value!r}"
    )
    assert not (tmp_path / "out").exists()


def test_rounds_rotate_the_order_and_pool_the_samples():
    """With ``rounds`` each provider of a case is timed once per round, the order shifted
    by one each round (every provider timed first once with as many rounds as
    providers); its record pools the rounds' samples and keeps each round's median."""
    from opcore.bench import runner
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    case = cases.build("rms_norm", 2, 256, torch.float32, torch.device("cpu"), quick=True)
    order: list[str] = []

    def provider(name):
        def fn():
            if not order or order[-1] != name:
                order.append(name)
            return case.args[0] * 2

        return fn

    fns = {name: provider(name) for name in ("a", "b", "c")}
    opts = runner.Options(rounds=3, rep_ms=1)
    env = {"provider_identity": {}, "copy_gbs": None}
    recs = runner.time_case(case, fns, env, platform, "host", opts, on_platform=False)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [r["provider"] for r in recs] == ["a", "b", "c"]
    for r in recs:
        assert r["rounds"] == 3 and len(r["cpu_round_us"]) == 3
        s = r["cpu_spread"]
        assert s["min_us"] <= r["cpu_us"] == s["median_us"]
        assert s["reps"] >= 3 * 3  # every round's samples, pooled
    assert runner.rotated(["a", "b"], 3) == ["b", "a"] and runner.rotated([], 2) == []


def test_a_provider_that_raises_is_recorded_once_and_not_timed_again():
    from opcore.bench import runner
    from opcore.platforms import get_current_platform

    case = cases.build("rms_norm", 2, 256, torch.float32, torch.device("cpu"), quick=True)
    calls = {"bad": 0, "good": 0}

    def bad():
        calls["bad"] += 1
        raise RuntimeError("no kernel for this\n shape")

    def good():
        calls["good"] += 1

    opts = runner.Options(rounds=2, rep_ms=1)
    env = {"provider_identity": {}, "copy_gbs": None}
    fns = {"bad": bad, "good": good}
    recs = runner.time_case(case, fns, env, get_current_platform(), "host", opts, False)
    assert calls["bad"] == 1 and calls["good"] > 2
    assert recs[0]["error"] == "RuntimeError: no kernel for this shape"
    assert "cpu_us" not in recs[0] and recs[1]["rounds"] == 2


def test_bench_rounds_on_the_cli(tmp_path):
    rc = main(["bench", "--quick", "--device", "cpu", "--ops", "rms_norm", "--tokens", "2",
               "--providers", "native,F.rms_norm", "--rounds", "2",
               "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["environment"]["rounds"] == 2
    assert all(r["rounds"] == 2 and len(r["cpu_round_us"]) == 2 for r in result["records"])
    proc = _bench_cli(["--quick", "--rounds", "0", "--out", str(tmp_path / "out")])
    assert proc.returncode == 2 and "argument --rounds: expected a positive integer" in proc.stderr
