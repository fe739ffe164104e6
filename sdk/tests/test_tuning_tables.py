"""Malformed tuning tables (issue 27, items 4 and 5): refused when the table loads, never
met by a lookup.

A table found by the search (the user cache dir, a plugin's ``opcore.tuning_tables``
package) with a malformed entry, or a ``*.json`` that is a directory, a dangling link or a
FIFO, is left out with one `TuningWarning` naming the file and the entry; the other op
calls run. A table named by ``OPCORE_TUNING`` is an error (`TuningTableError`) naming it and
the entry, and ``opcore info`` exits 2 with one ``opcore info: error:`` line naming the
variable. The load runs in a fresh interpreter with the ``triton`` provider built under
Triton's interpreter, so the launch spaces' own checks see the entries as dispatch would.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from opcore.testing import make_distribution, run_python
from opcore.tuning import TuningTableError, buckets, table

# ----------------------------------------------------------------------------- parse
GOOD_ENTRY = {
    "op": "rms_norm",
    "dtype": "bfloat16",
    "tokens": 8,
    "shape": [64],
    "order": ["native"],
    "configs": {"triton": {"BLOCK_N": 64, "ROWS": 1, "num_warps": 1}},
}


def _doc(*entries, **over):
    doc = {
        "format": table.FORMAT,
        "version": table.VERSION,
        "environment": dict.fromkeys(table.ENVIRONMENT_KEYS, None),
        "providers": {},
        "entries": list(entries),
    }
    doc.update(over)
    return doc


BAD_ENTRIES = [
    ({"shape": [[64]]}, "entries[0].shape [[64]]: element 0 is [64]"),
    ({"shape": []}, "entries[0].shape []: rms_norm takes 1 element(s)"),
    ({"shape": ["a"]}, "entries[0].shape [\"a\"]: element 0 is 'a': rms_norm takes an int >= 1"),
    ({"shape": [64, 2]}, "entries[0].shape [64, 2]: rms_norm takes 1 element(s)"),
    ({"shape": [0]}, "entries[0].shape [0]: element 0 is 0"),
    ({"shape": [True]}, "entries[0].shape [true]: element 0 is True"),
    ({"shape": {"n": 64}}, "must be a list, got dict"),
    ({"op": "gelu_and_mul", "shape": [64, "erf"]}, "takes one of ['none', 'tanh']"),
    ({"op": "rotary_embedding", "shape": [4, 2]}, "rotary_embedding takes 3 element(s)"),
    ({"tokens": True}, "entries[0].tokens must be an int, got True"),
    ({"tokens": 2**60}, "entries[0].tokens is 1152921504606846976: at most 2**48"),
    ({"order": ["native", "native"]}, "entries[0].order names a provider twice"),
    ({"order": [""]}, "entries[0].order must be a list of provider names"),
    ({"configs": {"triton": {"BLOCK_N": "64"}}}, "BLOCK_N='64': each parameter must be an int"),
    ({"configs": {"triton": {"BLOCK_N": True}}}, "BLOCK_N=True: each parameter must be an int"),
    ({"op": ""}, "entries[0].op must not be empty"),
]


@pytest.mark.parametrize("change, message", BAD_ENTRIES)
def test_a_malformed_entry_is_an_error_naming_the_file_and_entry(change, message):
    with pytest.raises(TuningTableError) as err:
        table.parse(_doc({**GOOD_ENTRY, **change}), source="t.json")
    assert str(err.value).startswith("tuning table t.json: entries[0]")
    assert message in str(err.value)


@pytest.mark.parametrize("change, message", BAD_ENTRIES[:4])
def test_a_searched_table_leaves_the_malformed_entry_out_and_keeps_the_rest(change, message):
    parsed = table.parse(
        _doc({**GOOD_ENTRY, **change}, GOOD_ENTRY), source="t.json", skip_invalid_entries=True
    )
    assert [e.index for e in parsed.entries] == [1]
    assert len(parsed.invalid) == 1 and message in parsed.invalid[0]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"environment": {**dict.fromkeys(table.ENVIRONMENT_KEYS), "device": ["x"]}}, "device"),
        ({"version": True}, "'version' is True"),
    ],
)
def test_a_malformed_document_is_an_error_even_when_entries_are_skipped(change, message):
    with pytest.raises(TuningTableError, match="tuning table t.json: ") as err:
        table.parse(_doc(GOOD_ENTRY, **change), source="t.json", skip_invalid_entries=True)
    assert message in str(err.value)


def test_empty_deep_and_unreadable_files_are_table_errors(tmp_path):
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    (tmp_path / "dir.json").mkdir()
    os.symlink(tmp_path / "nowhere", tmp_path / "gone.json")
    for name, what in [
        ("empty.json", "the file is empty"),
        ("deep.json", "nested too deeply"),
        ("dir.json", "cannot be read (a directory)"),
        ("gone.json", "cannot be read (no such file)"),
    ]:
        with pytest.raises(TuningTableError, match="tuning table .*" + name) as err:
            table.load(tmp_path / name)
        assert what in str(err.value), str(err.value)


def test_a_declared_bucket_shape_is_checked_and_a_redeclared_key_drops_it():
    assert buckets.shape_problem("gelu_and_mul", [64, "tanh"]) is None
    assert buckets.shape_problem("rotary_embedding", [4, 0, 64]) is None  # no key heads
    assert buckets.shape_problem("plugin_op_without_spec", [3, "x"]) is None
    assert "element 0" in buckets.shape_problem("plugin_op_without_spec", [[3]])
    with pytest.raises(ValueError, match="shape element 'big'"):
        buckets.register_bucket_key("tables_test_op", lambda x: (x.dtype, 1, ()), shape=("big",))
    buckets.register_bucket_key("tables_test_op", lambda x: (x.dtype, 1, (1,)), shape=("size",))
    assert "takes 1 element" in buckets.shape_problem("tables_test_op", [])
    buckets.register_bucket_key("tables_test_op", lambda x: (x.dtype, 1, (1, 2)))
    assert buckets.shape_problem("tables_test_op", [1, 2]) is None


# ----------------------------------------------------------------------------- load
# One fresh interpreter for every case: the triton provider built under the interpreter
# (its launch spaces check configurations), a table written per case, the op calls made
# as a program makes them (no reload first: the first call loads the table).
CHILD = r"""
import json, os, sys, warnings
import opcore.kernels.triton as kt
assert kt.INTERPRETED
import torch
from opcore.ir import ops
from opcore.platforms.kernels import ensure_kernels_loaded
from opcore.tuning import runtime, table

ensure_kernels_loaded()
cases = json.loads(sys.argv[1])
root = sys.argv[2]
env = runtime.environment()
ids = {"rms_norm": {p: ops.rms_norm.identity_hash(p) for p in ops.rms_norm.impls}}
good = {"op": "rms_norm", "dtype": "bfloat16", "tokens": 8, "shape": [64],
        "order": ["triton", "native"],
        "configs": {"triton": {"BLOCK_N": 64, "ROWS": 2, "num_warps": 1}}}
x = torch.randn(8, 128, dtype=torch.bfloat16)
xn, w = torch.randn(8, 64, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16)
results = {}
for n, (mode, change, stale) in enumerate(cases):
    providers = json.loads(json.dumps(ids))
    if stale:
        providers["rms_norm"]["triton"] = "0" * 64
    bad = {**good, **change}
    doc = {"format": table.FORMAT, "version": 1, "environment": env,
           "providers": providers, "entries": [bad, good]}
    where = os.path.join(root, f"case{n}")
    os.makedirs(os.path.join(where, "opcore", "tuning"))
    path = os.path.join(where, "opcore", "tuning", "t.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    if mode == "env":
        os.environ["OPCORE_TUNING"] = path
    else:
        os.environ.pop("OPCORE_TUNING", None)
        os.environ["XDG_CACHE_HOME"] = where
    got = {"errors": [], "warnings": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            runtime.reload()  # what a program does after changing OPCORE_TUNING
        except Exception as exc:
            got["errors"].append([type(exc).__name__, str(exc)])
        for _ in range(2):  # every call, not only the first
            for call in (lambda: ops.silu_and_mul(x), lambda: ops.rms_norm(xn, w, 1e-6)):
                try:
                    call()
                except Exception as exc:
                    got["errors"].append([type(exc).__name__, str(exc)])
    got["warnings"] = [str(c.message) for c in caught if c.category is runtime.TuningWarning]
    got["path"] = path
    if not got["errors"]:
        got["lookup"] = runtime.launch_config("rms_norm", "triton", torch.bfloat16, 8, (64,))
    results[n] = got
print("RESULT " + json.dumps(results, default=str))
"""

LOAD_CASES = [
    (mode, change, stale)
    for change in ({"shape": [[64]]}, {"shape": []}, {"shape": ["a"]}, {"shape": [64, 2]})
    for mode, stale in (("search", False), ("search", True), ("env", False))
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    pytest.importorskip("triton")
    root = tmp_path_factory.mktemp("tables")
    proc = run_python(
        CHILD,
        env={"TRITON_INTERPRET": "1", "OPCORE_PLATFORM": "cpu"},
        args=[json.dumps(LOAD_CASES), str(root)],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("n", range(len(LOAD_CASES)), ids=[str(c) for c in LOAD_CASES])
def test_a_malformed_entry_never_reaches_an_op_call(loaded, n):
    mode, change, stale = LOAD_CASES[n]
    got = loaded[str(n)]
    shape = json.dumps(change["shape"])
    if mode == "env":
        # Named explicitly: the load and every call raise the table error, naming the
        # file and the entry.
        assert len(got["errors"]) == 5, got
        for kind, message in got["errors"]:
            assert kind == "TuningTableError", (kind, message)
            assert f"OPCORE_TUNING={got['path']}" in message
            assert f"entries[0].shape {shape}" in message
        return
    # Found by the search: left out with one warning naming file and entry; the rest of
    # the table (the good entry, its Triton configuration) is used, every call runs.
    assert got["errors"] == [], got["errors"]
    assert len(got["warnings"]) == 1, got["warnings"]
    assert f"{got['path']}: entries[0].shape {shape}" in got["warnings"][0]
    assert "(entry left out)" in got["warnings"][0]
    if stale:  # the good entry's triton part is stale too: in the same one warning
        assert "rms_norm/triton (identity changed)" in got["warnings"][0]
        assert got["lookup"] is None
    else:
        assert got["lookup"] == {"BLOCK_N": 64, "ROWS": 2, "num_warps": 1}


# A plugin's tuning package: a directory named *.json, a dangling link, a FIFO (reading it
# would block for ever), a table with a malformed entry next to a good one.
PLUGIN_CHILD = r"""
import json, os, sys, warnings
import opcore.kernels.triton as kt
import torch
import plugtables
from opcore.ir import ops
from opcore.platforms.kernels import ensure_kernels_loaded
from opcore.tuning import runtime, table

ensure_kernels_loaded()
pkg = os.path.dirname(plugtables.__file__)
ids = {"rms_norm": {p: ops.rms_norm.identity_hash(p) for p in ops.rms_norm.impls}}
good = {"op": "rms_norm", "dtype": "bfloat16", "tokens": 8, "shape": [64],
        "order": ["triton", "native"],
        "configs": {"triton": {"BLOCK_N": 64, "ROWS": 2, "num_warps": 1}}}
doc = {"format": table.FORMAT, "version": 1, "environment": runtime.environment(),
       "providers": ids, "entries": [good, {**good, "shape": []}]}
with open(os.path.join(pkg, "mixed.json"), "w") as f:
    json.dump(doc, f)
os.mkdir(os.path.join(pkg, "adir.json"))
os.symlink(os.path.join(pkg, "nowhere"), os.path.join(pkg, "gone.json"))
os.mkfifo(os.path.join(pkg, "fifo.json"))
x = torch.randn(8, 128, dtype=torch.bfloat16)
errors = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        try:
            ops.silu_and_mul(x)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
out = {
    "errors": errors,
    "warnings": [str(c.message) for c in caught if c.category is runtime.TuningWarning],
    "used": runtime.info()["used"],
    "lookup": runtime.launch_config("rms_norm", "triton", torch.bfloat16, 8, (64,)),
}
print("RESULT " + json.dumps(out, default=str))
"""


def test_a_plugins_unreadable_tables_are_left_out_with_one_warning(tmp_path):
    pytest.importorskip("triton")
    site = tmp_path / "site"
    make_distribution(
        site,
        "opcore-tables-test",
        entry_points={"opcore.tuning_tables": {"tabletest": "plugtables"}},
        files={"plugtables/__init__.py": ""},
    )
    proc = run_python(
        PLUGIN_CHILD,
        site=site,
        env={
            "TRITON_INTERPRET": "1",
            "OPCORE_PLATFORM": "cpu",
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
        },
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert out["errors"] == []
    assert len(out["warnings"]) == 1, out["warnings"]
    warning = out["warnings"][0]
    for name, why in [
        ("adir.json", "cannot be read (a directory)"),
        ("gone.json", "cannot be read"),
        ("fifo.json", "cannot be read (not a regular file)"),
        ("mixed.json", "entries[1].shape []: rms_norm takes 1 element(s)"),
    ]:
        part = next((p for p in warning.split("; ") if f"plugtables/{name}" in p), None)
        assert part is not None and why in part, (name, warning)
    assert [u for u in out["used"] if "mixed.json" in u], out["used"]
    assert out["lookup"] == {"BLOCK_N": 64, "ROWS": 2, "num_warps": 1}


# ----------------------------------------------------------------------------- info
def _info(tuning, tmp_path):
    code = "from opcore.cli import main; raise SystemExit(main(['info', '--json']))"
    return run_python(
        code,
        env={"OPCORE_TUNING": tuning, "XDG_CACHE_HOME": str(tmp_path / "cache")},
        timeout=180,
    )


@pytest.mark.parametrize(
    "kind, what",
    [
        ("missing", "no such file"),
        ("directory", "is a directory"),
        ("empty", "not valid JSON (the file is empty)"),
        ("truncated", "not valid JSON"),
        ("bad entry", "entries[0].shape [[64]]"),
    ],
)
def test_info_exits_2_naming_opcore_tuning_when_the_named_table_is_broken(kind, what, tmp_path):
    path = tmp_path / "t.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_text("")
    elif kind == "truncated":
        path.write_text(json.dumps(_doc(GOOD_ENTRY))[:60])
    elif kind == "bad entry":
        path.write_text(json.dumps(_doc({**GOOD_ENTRY, "shape": [[64]]})))
    proc = _info(str(path), tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("opcore info: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"OPCORE_TUNING={path}" in errors[0] or f"OPCORE_TUNING='{path}'" in errors[0]
    assert what in errors[0], errors[0]
    data = json.loads(proc.stdout)
    assert data["error_kind"] == "config" and what in data["error"]
    assert "error" in data["tuning"]  # the section says it too


def test_info_still_exits_0_with_tuning_off(tmp_path):
    proc = _info("off", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["tuning"]["mode"] == "off"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
