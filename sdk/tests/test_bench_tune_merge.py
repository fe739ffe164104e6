"""bench/tune_merge.py over tables written by real `opcore tune` runs on the CPU: the
named ops' entries and identities come from the fresh search, the rest of the base stays
as it was, and tables for another machine, an op the new search did not cover or a
repeated op are refused with the part that differs named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opcore.testing import scripts
from opcore.tuning import table as tt

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "tune_merge.py"
SHIPPED = ROOT / "plugins/cuda/src/opcore_plugin_cuda/tuning/nvidia-h200-torch2.11-triton3.6.json"
TUNE = "import sys; from opcore.cli import main; sys.exit(main(sys.argv[1:]))"


def load_script():
    return scripts.load_script(SCRIPT)


def tune(tmp_path: Path, name: str, ops: str) -> Path:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    env.update(OPCORE_PLATFORM="cpu", XDG_CACHE_HOME=str(tmp_path / "cache"))
    out = tmp_path / f"{name}.json"
    args = ["tune", "--quick", "--ops", ops, "--tokens", "1,8", "--hidden", "64",
            "--providers", "native", "--budget-s", "120", "--out", str(out)]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", TUNE, *args], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def of(doc: dict, op: str) -> list:
    return [e for e in doc["entries"] if e["op"] == op]


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("merge")
    return tune(tmp, "base", "rms_norm,rotary_embedding"), tune(tmp, "new", "rotary_embedding")


def test_the_named_ops_come_from_the_new_search_and_the_rest_stays(tables, tmp_path):
    tm = load_script()
    base_path, new_path = tables
    base, new = (json.loads(p.read_text()) for p in tables)
    out = tmp_path / "merged.json"
    assert tm.main([str(base_path), str(new_path), "--ops", "rotary_embedding",
                    "--out", str(out)]) == 0  # fmt: skip
    merged = json.loads(out.read_text())
    tt.load(out)  # a valid table
    rope = "rotary_embedding"
    assert of(merged, "rms_norm") == of(base, "rms_norm")
    assert of(merged, rope) == of(new, rope) and of(merged, rope) != of(base, rope)
    assert merged["providers"]["rms_norm"] == base["providers"]["rms_norm"]
    assert merged["providers"]["rotary_embedding"] == new["providers"]["rotary_embedding"]
    assert merged["search"]["date"] == base["search"]["date"]
    (update,) = merged["search"]["updates"]
    assert update["replaced_ops"] == [rope] and update["date"] == new["search"]["date"]
    assert json.loads(base_path.read_text()) == base  # --out given: the base is untouched


def test_what_cannot_be_merged_is_named(tables, capsys, tmp_path):
    tm = load_script()
    base_path, new_path = tables
    base, new, shipped = str(base_path), str(new_path), str(SHIPPED)
    cases = [
        ([shipped, new, "--ops", "rotary_embedding"], "environment.platform differs"),
        ([base, new, "--ops", "rms_norm"], "did not search 'rms_norm'"),
        ([base, new, "--ops", "rotary_embedding,rotary_embedding"], "each op once"),
    ]
    before = SHIPPED.read_bytes()
    for argv, why in cases:
        assert tm.main([*argv, "--out", str(tmp_path / "merged.json")]) == 2
        assert why in capsys.readouterr().err
        assert not (tmp_path / "merged.json").exists()
    assert SHIPPED.read_bytes() == before


def test_drop_removes_the_named_ops_and_says_why(tables, capsys, tmp_path):
    tm = load_script()
    base_path, _ = tables
    base = json.loads(base_path.read_text())
    out = tmp_path / "dropped.json"
    why = "the rotary kernel changed; not re-searched on this device yet"
    assert tm.main([str(base_path), "--drop", "rotary_embedding", "--why", why,
                    "--out", str(out)]) == 0  # fmt: skip
    dropped = json.loads(out.read_text())
    tt.load(out)  # still a valid table
    assert of(dropped, "rotary_embedding") == [] and of(base, "rotary_embedding")
    assert of(dropped, "rms_norm") == of(base, "rms_norm")
    assert "rotary_embedding" not in dropped["providers"]
    assert dropped["providers"]["rms_norm"] == base["providers"]["rms_norm"]
    assert dropped["search"]["updates"] == [{"dropped_ops": ["rotary_embedding"], "why": why}]
    # Refused, named: no reason, an op without entries, a NEW table given as well.
    for argv, msg in [
        ([str(base_path), "--drop", "rotary_embedding"], "needs --why"),
        ([str(base_path), "--drop", "gelu_and_mul", "--why", "x"], "no entry for 'gelu_and_mul'"),
    ]:
        assert tm.main([*argv, "--out", str(tmp_path / "no.json")]) == 2
        assert msg in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tm.main([str(base_path), str(base_path), "--ops", "rms_norm", "--drop", "rms_norm"])
    assert not (tmp_path / "no.json").exists()


def test_restamp_renews_the_named_ops_identities_keeps_their_entries_and_says_why(
    tables, capsys, tmp_path
):
    tm = load_script()
    base_path, _ = tables
    base = json.loads(base_path.read_text())
    # As if a file every provider's identity covers had changed since the search.
    aged = json.loads(base_path.read_text())
    for op in aged["providers"]:
        aged["providers"][op] = {p: "0" * 64 for p in aged["providers"][op]}
    aged_path = tmp_path / "aged.json"
    aged_path.write_text(json.dumps(aged))
    out = tmp_path / "restamped.json"
    why = "_launch.py: only the head kernels' rule changed; rms_norm never calls it"
    assert tm.main([str(aged_path), "--restamp", "rms_norm", "--why", why,
                    "--out", str(out)]) == 0  # fmt: skip
    done = json.loads(out.read_text())
    tt.load(out)
    assert done["providers"]["rms_norm"] == base["providers"]["rms_norm"]  # this code's hash
    assert done["providers"]["rotary_embedding"] == aged["providers"]["rotary_embedding"]
    assert done["entries"] == aged["entries"]
    (update,) = done["search"]["updates"]
    assert update["why"] == why
    assert update["restamped"] == {
        "rms_norm/native": {"from": "0" * 64, "to": base["providers"]["rms_norm"]["native"]}
    }
    for argv, msg in [
        ([str(aged_path), "--restamp", "rms_norm"], "needs --why"),
        (
            [str(aged_path), "--restamp", "gelu_and_mul", "--why", "x"],
            "no entry for 'gelu_and_mul'",
        ),
        ([str(base_path), "--restamp", "rms_norm", "--why", "x"], "already match"),
    ]:
        assert tm.main([*argv, "--out", str(tmp_path / "no.json")]) == 2
        assert msg in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tm.main([str(aged_path), "--restamp", "rms_norm", "--drop", "rms_norm", "--why", "x"])
    assert not (tmp_path / "no.json").exists()


def test_restamp_with_drop_tokens_removes_those_buckets_only_and_records_them(
    tables, capsys, tmp_path
):
    tm = load_script()
    base_path, _ = tables
    base = json.loads(base_path.read_text())
    aged = json.loads(base_path.read_text())
    aged["providers"]["rms_norm"] = {p: "0" * 64 for p in aged["providers"]["rms_norm"]}
    aged_path = tmp_path / "aged.json"
    aged_path.write_text(json.dumps(aged))
    out = tmp_path / "restamped.json"
    why = "the kernel changed at decode sizes only"
    assert tm.main([str(aged_path), "--restamp", "rms_norm", "--drop-tokens", "1",
                    "--why", why, "--out", str(out)]) == 0  # fmt: skip
    done = json.loads(out.read_text())
    tt.load(out)
    assert done["providers"]["rms_norm"] == base["providers"]["rms_norm"]
    assert [e["tokens"] for e in of(done, "rms_norm")] == [
        e["tokens"] for e in of(aged, "rms_norm") if e["tokens"] != 1
    ] and {e["tokens"] for e in of(aged, "rms_norm")} >= {1, 8}
    assert of(done, "rotary_embedding") == of(aged, "rotary_embedding")  # not named: kept
    (update,) = done["search"]["updates"]
    assert update["dropped_tokens"] == [1] and update["why"] == why
    for argv, msg in [
        (["--drop-tokens", "2"], "no entry at the token bucket(s) [2]"),
        (["--drop-tokens", "1,8"], "leaves 'rms_norm' no entry: use --drop"),
    ]:
        full = [str(aged_path), "--restamp", "rms_norm", *argv, "--why", "x"]
        assert tm.main([*full, "--out", str(tmp_path / "no.json")]) == 2
        assert msg in capsys.readouterr().err
    with pytest.raises(SystemExit):  # only with --restamp
        tm.main([str(aged_path), "--drop", "rms_norm", "--drop-tokens", "1", "--why", "x"])
    assert not (tmp_path / "no.json").exists()
