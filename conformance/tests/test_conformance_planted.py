"""The suite catches planted defects, each with the right status, and passes a correct
provider. The defects live in real installed distributions (see conftest.py); the suite runs
in a fresh interpreter through its real front ends: ``python -m opcore_conformance``, the
pytest plugin, and ``python -m opcore conformance``."""

from __future__ import annotations

import json

import pytest

PROVIDERS = ",".join(
    [
        "planted_good",
        "planted_eps",
        "planted_dtype",
        "planted_rows",
        "planted_mutates",
        "planted_values",
        "planted_symbool",
        "planted_style",
        "native",
    ]
)


@pytest.fixture(scope="module")
def provider_run(planted_site, tmp_path_factory, run_suite, read_statuses):
    report_dir = tmp_path_factory.mktemp("providers") / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--ops",
            "rms_norm,rotary_embedding",
            "--providers",
            PROVIDERS,
            "--dtypes",
            "float32,bfloat16",
            "--checks",
            "numerics,functional,supports_args,layers",
            "--expectations",
            "none",
            "--no-progress",
        ],
        site=planted_site,
        report_dir=report_dir,
    )
    return proc, read_statuses(report_dir), report_dir


def _statuses(records, check, provider, dtype=None, op="rms_norm"):
    return {
        r["sample"]: r["status"]
        for r in records.values()
        if r["check"] == check
        and r["provider"] == provider
        and r["op"] == op
        and (dtype is None or r["dtype"] == dtype)
    }


def test_run_fails_and_writes_every_report(provider_run):
    proc, records, report_dir = provider_run
    assert proc.returncode == 1, proc.stderr[-2000:]
    for name in ("conformance.jsonl", "conformance.md", "conformance-junit.xml"):
        assert (report_dir / name).stat().st_size > 0
    header = json.loads((report_dir / "conformance.jsonl").read_text().splitlines()[0])
    assert header["type"] == "header" and header["platform"] == "cpu"
    assert {"torch", "opcore", "python"} <= set(header["versions"])
    assert header["seed"] is not None and header["device_name"]
    assert "planted_eps" in header["providers"]["rms_norm"]


def test_correct_provider_passes_everything(provider_run):
    _, records, _ = provider_run
    for check in ("numerics", "functional"):
        got = _statuses(records, check, "planted_good")
        assert got and set(got.values()) == {"pass"}, got


def test_epsilon_in_the_wrong_place_fails_numerics(provider_run):
    _, records, _ = provider_run
    got = _statuses(records, "numerics", "planted_eps", "float32")
    assert got["eps_1e-2_kwargs"] == "fail"
    rec = records["numerics[rms_norm-planted_eps-float32-eps_1e-2_kwargs]"]
    assert rec["max_ratio"] > 1 and rec["atol"] is not None and rec["ref_dtype"] == "float64"
    assert rec["repro"].startswith("opcore conformance --platform cpu --case ")
    assert "numerics[rms_norm-planted_eps-float32-eps_1e-2_kwargs]" in rec["repro"]


def test_wrong_output_dtype_fails_where_it_differs(provider_run):
    _, records, _ = provider_run
    assert set(_statuses(records, "numerics", "planted_dtype", "float32").values()) == {"pass"}
    bf16 = _statuses(records, "numerics", "planted_dtype", "bfloat16")
    assert set(bf16.values()) == {"fail"}
    assert (
        "dtype float32, expected bfloat16"
        in records["numerics[rms_norm-planted_dtype-bfloat16-t1_h8]"]["message"]
    )


def test_rows_read_as_contiguous_fail_only_on_strided_samples(provider_run):
    _, records, _ = provider_run
    got = _statuses(records, "numerics", "planted_rows", "float32")
    assert got["strided_rows_t6_h96"] == "fail"
    assert got["t5_h129"] == "pass"
    strided = {s for s, st in got.items() if st == "fail"}
    assert strided and all("strided" in s for s in strided)


def test_default_overload_mutating_its_input_fails_functional(provider_run):
    _, records, _ = provider_run
    assert set(_statuses(records, "functional", "planted_mutates").values()) == {"fail"}
    rec = records["functional[rms_norm-planted_mutates-float32-t1_h8]"]
    assert "input 'x' was modified" in rec["message"]
    # the values it returns are right: only the contract check catches it
    assert set(_statuses(records, "numerics", "planted_mutates").values()) == {"pass"}


def test_supports_args_reading_values_fails_on_fake_tensors(provider_run):
    _, records, _ = provider_run
    got = _statuses(records, "supports_args", "planted_values")
    assert got and set(got.values()) == {"fail"}
    assert "fake" in records["supports_args[rms_norm-planted_values-float32-t1_h8]"]["message"]
    # providers without supports_args are not_applicable, not pass
    assert records["supports_args[rms_norm-planted_good]"]["status"] == "not_applicable"


def test_supports_args_returning_a_symbool_fails_on_symbolic_fake_tensors(provider_run):
    _, records, _ = provider_run
    got = _statuses(records, "supports_args", "planted_symbool")
    assert got and set(got.values()) == {"fail"}
    message = records["supports_args[rms_norm-planted_symbool-float32-t1_h8]"]["message"]
    assert "SymBool" in message and "symbolic fake tensors" in message, message
    # a plain bool everywhere else: its numerics pass
    assert set(_statuses(records, "numerics", "planted_symbool").values()) == {"pass"}


def test_rotary_ignoring_the_style_flag_fails_gptj_samples_only(provider_run):
    _, records, _ = provider_run
    got = _statuses(records, "numerics", "planted_style", "float32", op="rotary_embedding")
    neox = {s: v for s, v in got.items() if s.endswith("_neox")}
    gptj = {s: v for s, v in got.items() if s.endswith("_gptj")}
    assert neox and set(neox.values()) == {"pass"}, neox
    assert gptj and "fail" in set(gptj.values()), gptj


def test_repro_command_reruns_exactly_that_case(
    provider_run, planted_site, tmp_path, run_suite, read_statuses
):
    _, records, _ = provider_run
    cid = "numerics[rms_norm-planted_eps-float32-eps_1e-2_kwargs]"
    args = records[cid]["repro"].split()[2:]  # drop "opcore conformance"
    args = [a.strip("'") for a in args]
    proc = run_suite(
        args + ["--expectations", "none", "--no-progress"],
        site=planted_site,
        report_dir=tmp_path / "again",
    )
    again = read_statuses(tmp_path / "again")
    assert list(again) == [cid] and again[cid]["status"] == "fail"
    assert proc.returncode == 1


def test_oot_layer_replacement_is_built_bound_and_checked_against_native(provider_run):
    _, records, _ = provider_run
    # both replacements are built and bound to the forward_oot they define
    for name in ("rms_norm", "rotary_embedding"):
        rec = records[f"layers.binding[{name}]"]
        assert rec["status"] == "pass" and rec["details"]["method"] == "forward_oot", rec
        assert rec["details"]["replacement"] is True
    # the replacement that ignores its weight disagrees with forward_native; the correct one agrees
    assert records["layers.agree[rms_norm-float32]"]["status"] == "fail"
    assert "forward_native" in records["layers.agree[rms_norm-float32]"]["message"]
    assert records["layers.agree[rotary_embedding-float32]"]["status"] == "pass"


def test_opcheck_catches_a_provider_whose_output_disagrees_with_the_fake(
    planted_site, tmp_path, run_suite, read_statuses
):
    # The fake implementation says bfloat16 (the native function's dtype); the provider
    # returns float32: torch.library.opcheck's fake-tensor test fails, the correct one passes.
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--expectations",
            "none",
            "--no-progress",
            "--case",
            "opcheck[rms_norm-planted_dtype-bfloat16-*]",
            "--case",
            "opcheck[rms_norm-planted_good-bfloat16-*]",
        ],
        site=planted_site,
        report_dir=tmp_path / "r",
    )
    records = read_statuses(tmp_path / "r")
    bad = {k: r["status"] for k, r in records.items() if "planted_dtype" in k}
    good = {k: r["status"] for k, r in records.items() if "planted_good" in k}
    assert bad and set(bad.values()) == {"fail"}, bad
    assert good and set(good.values()) == {"pass"}, good
    assert proc.returncode == 1
