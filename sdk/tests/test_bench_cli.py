"""`opcore bench` runs on the CPU, on a platform without timing events (vdev) and, through
the `Platform`'s methods, with device timers; it writes its JSON and Markdown outputs
(timings are not checked: performance is measured by benchmarks, never by tests)."""

from __future__ import annotations

import json
import time

import torch

from opcore.bench import cases
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
    paths = report.write_all(result, str(tmp_path))
    assert "| device µs | graph µs |" in (tmp_path / "bench.md").read_text()
    assert paths["json"]
