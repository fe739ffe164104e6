"""certificate.json: every run writes one, and `opcore info` reads the ones a plugin ships.

The plugin is a real installed distribution (`opcore.testing.make_distribution`) with a
correct rms_norm provider; the suite runs on it in a fresh interpreter, its certificate is
shipped in the plugin's ``certificates/`` folder, and `opcore info --json` (another fresh
interpreter) must call that provider certified. Editing the provider's module changes its
identity hash: then it must say "not certified".
"""

from __future__ import annotations

import json
import shutil

import pytest

from opcore.testing import make_distribution, run_python

PLUGIN = """
from opcore.ir import ops


def certified_rms(x, weight, epsilon, variance_size=None):
    return ops.rms_norm.native(x, weight, epsilon, variance_size)


def register():
    if "cert_good" not in ops.rms_norm.impls:
        ops.rms_norm.register_impl("cert_good")(certified_rms)
"""

PRIORITY = {"OPCORE_IR_OP_PRIORITY": "rms_norm=cert_good,native"}


@pytest.fixture(scope="module")
def certified_run(tmp_path_factory, run_suite):
    site = tmp_path_factory.mktemp("cert-site")
    make_distribution(
        site,
        "opcore-cert-plugin",
        entry_points={"opcore.general_plugins": {"cert": "cert_plugin:register"}},
        files={"cert_plugin/__init__.py": PLUGIN},
    )
    report_dir = tmp_path_factory.mktemp("cert") / "reports"
    proc = run_suite(
        [
            "--platform",
            "cpu",
            "--ops",
            "rms_norm",
            "--providers",
            "cert_good,native",
            "--dtypes",
            "float32",
            "--checks",
            "numerics",
            "--expectations",
            "none",
            "--no-progress",
        ],
        site=site,
        report_dir=report_dir,
    )
    return site, report_dir, proc


def _info(site):
    code = "from opcore.cli import main; raise SystemExit(main(['info', '--json']))"
    proc = run_python(code, site=site, env=PRIORITY, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["certificates"]


def test_run_writes_a_certificate_matching_the_run(certified_run):
    site, report_dir, proc = certified_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cert = json.loads((report_dir / "certificate.json").read_text())
    records = [
        json.loads(line) for line in (report_dir / "conformance.jsonl").read_text().splitlines()
    ]
    cases = [r for r in records if r["type"] == "case"]
    header = records[0]
    assert cert["format"] == "opcore-conformance-certificate" and cert["format_version"] == 1
    assert cert["mode"] == "quick" and cert["device_type"] == "cpu" and cert["platform"] == "cpu"
    assert cert["versions"]["torch"] and cert["versions"]["opcore"]
    assert cert["suite"].startswith("opcore-conformance@")
    assert "opcore-cert-plugin@0.1.0" in cert["plugins"]
    assert cert["complete"] is False  # filtered: a run of a selection, and it says so
    assert sum(cert["counts"].values()) == len(cases)
    assert cert["counts"]["pass"] == sum(r["status"] == "pass" for r in cases)
    by_name = {(p["op"], p["provider"]): p for p in cert["providers"]}
    assert set(by_name) == {("rms_norm", "cert_good"), ("rms_norm", "native")}
    good = by_name[("rms_norm", "cert_good")]
    assert good["passed"] is True and good["distribution"] == "opcore-cert-plugin@0.1.0"
    assert good["counts"]["pass"] == sum(
        r["provider"] == "cert_good" and r["status"] == "pass" for r in cases
    )
    # the whole identity hash, the one the header's provider table shows a prefix of
    assert len(good["identity"]) == 64
    assert good["identity"].startswith(header["providers"]["rms_norm"]["cert_good"]["identity"])


def test_shipped_certificate_certifies_and_an_edit_revokes(certified_run, tmp_path):
    site, report_dir, _ = certified_run
    shipped = tmp_path / "site"
    shutil.copytree(site, shipped)
    folder = shipped / "cert_plugin" / "certificates"
    folder.mkdir()
    shutil.copy(report_dir / "certificate.json", folder / "cpu-quick.json")
    (folder / "broken.json").write_text("{not json")

    cov = _info(shipped)
    assert cov["device_type"] == "cpu"
    assert "cert_plugin/certificates/cpu-quick.json" in cov["found"]
    assert any("broken.json" in e and "not valid JSON" in e for e in cov["errors"])
    entry = cov["ops"]["rms_norm"]["cert_good"]
    assert entry["status"] == "certified" and entry["modes"] == ["quick"], entry
    # an op the run did not check is in use too, and not certified
    assert cov["ops"]["silu_and_mul"]["native"]["status"] == "not certified"

    # Any edit to the provider's module changes its identity: the certificate no longer holds.
    module = shipped / "cert_plugin" / "__init__.py"
    module.write_text(module.read_text() + "\n# edited after certification\n")
    entry = _info(shipped)["ops"]["rms_norm"]["cert_good"]
    assert entry["status"] == "not certified"
    assert "source changed" in entry["why"]


def test_core_reader_and_suite_writer_agree_on_the_format():
    from opcore import certificates as core
    from opcore_conformance.report import certificate as suite

    assert (suite.FORMAT, suite.FORMAT_VERSION) == (core.FORMAT, core.FORMAT_VERSION)
    # a certificate for another device type does not cover this one
    cert = core.parse(
        {
            "format": core.FORMAT,
            "format_version": 1,
            "device_type": "cuda",
            "mode": "full",
            "providers": [{"op": "o", "provider": "p", "identity": "a" * 64, "passed": True}],
        },
        "x.json",
    )
    cov = core.coverage("o", "p", "a" * 64, "cpu", [cert])
    assert cov["status"] == "not certified" and "device type 'cuda'" in cov["why"]
    assert core.coverage("o", "p", "a" * 64, "cuda", [cert])["modes"] == ["full"]
    with pytest.raises(core.CertificateError, match="format_version"):
        core.parse({**cert.data, "format_version": 2}, "y.json")
