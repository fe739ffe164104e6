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

# A third party's plugin: a provider of its own (so `opcore info` reads its package), and
# a predicate so that the chain goes on past it to cert_good (listed after it).
THIEF = """
from opcore.ir import ops


def thief_rms(x, weight, epsilon, variance_size=None):
    return ops.rms_norm.native(x, weight, epsilon, variance_size)


def any_args(x, weight, epsilon, variance_size=None):
    return True


def register():
    if "cert_thief" not in ops.rms_norm.impls:
        ops.rms_norm.register_impl("cert_thief", supports_args=any_args)(thief_rms)
"""


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


def _info(site, priority=None):
    code = "from opcore.cli import main; raise SystemExit(main(['info', '--json']))"
    env = {"OPCORE_IR_OP_PRIORITY": priority} if priority else PRIORITY
    proc = run_python(code, site=site, env=env, timeout=120)
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
    assert len(cov["errors"]) == 1 and "broken.json" in cov["errors"][0]
    assert "not valid JSON" in cov["errors"][0]
    entry = cov["ops"]["rms_norm"]["cert_good"]
    assert entry["status"] == "certified" and entry["modes"] == ["quick"], entry
    assert entry["distribution"] == "opcore-cert-plugin"
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
    from opcore_conformance import status
    from opcore_conformance.report import certificate as suite

    assert (suite.FORMAT, suite.FORMAT_VERSION) == (core.FORMAT, core.FORMAT_VERSION)
    assert core.STATUSES == status.ALL and set(core.RED) == status.RED
    # a certificate for another device type does not cover this one
    cert = core.parse(
        {
            "format": core.FORMAT,
            "format_version": 1,
            "device_type": "cuda",
            "mode": "full",
            "complete": True,
            "filters": {},
            "counts": {"pass": 2},
            "providers": [
                {
                    "op": "o",
                    "provider": "p",
                    "identity": "a" * 64,
                    "passed": True,
                    "counts": {"pass": 2},
                }
            ],
        },
        "x.json",
        distribution="opcore-x",
    )
    cov = core.coverage("o", "p", "a" * 64, "cpu", [cert], distribution="opcore-x")
    assert cov["status"] == "not certified" and "device type 'cuda'" in cov["why"]
    assert core.coverage("o", "p", "a" * 64, "cuda", [cert], distribution="opcore-x")["modes"] == [
        "full"
    ]
    with pytest.raises(core.CertificateError, match="format_version"):
        core.parse({**cert.data, "format_version": 2}, "y.json")


def test_the_suites_certificate_parses_cleanly(certified_run):
    from opcore import certificates as core

    _, report_dir, _ = certified_run
    data = json.loads((report_dir / "certificate.json").read_text())
    assert data["stopped"] is None  # the run ended after its last collected case
    cert = core.parse(data, "certificate.json", distribution="opcore-cert-plugin")
    assert cert.void is None and cert.problems == {}


def test_a_certificate_shipped_by_another_distribution_certifies_nothing(certified_run, tmp_path):
    """The run's own certificate, correct in every field, shipped by a third-party package:
    a real installed distribution whose provider is in use, so its folder is read."""
    site, report_dir, _ = certified_run
    shipped = tmp_path / "site"
    shutil.copytree(site, shipped)
    make_distribution(
        shipped,
        "opcore-cert-thief",
        entry_points={"opcore.general_plugins": {"thief": "cert_thief:register"}},
        files={
            "cert_thief/__init__.py": THIEF,
            "cert_thief/certificates/cpu-quick.json": (report_dir / "certificate.json").read_text(),
        },
    )
    cov = _info(shipped, priority="rms_norm=cert_thief,cert_good,native")
    assert "cert_thief/certificates/cpu-quick.json" in cov["found"]
    entry = cov["ops"]["rms_norm"]["cert_good"]
    assert entry["status"] == "not certified", entry
    assert entry["distribution"] == "opcore-cert-plugin"
    assert entry["why"] == (
        "cert_thief/certificates/cpu-quick.json is shipped by opcore-cert-thief, the provider "
        "is registered by opcore-cert-plugin (a package certifies only its own distribution's "
        "providers)"
    )
