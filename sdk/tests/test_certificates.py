"""Certificates are trusted only as far as they go (issue 27, item 6).

`opcore.certificates.parse` is strict about types and values: a field of the wrong type
or outside its set makes the file unusable, a `CertificateError` naming the field. A
package certifies only providers of its own distribution; a duplicate or contradictory
entry, a run that stopped early, or a selection with red cases certifies nothing, and
`opcore info` says why.

The end-to-end tests run `opcore info --json` in a fresh interpreter over two real
installed distributions (`opcore.testing.make_distribution`: a dist-info with METADATA,
entry points and RECORD on ``sys.path``): ``opcore-cert-home`` registers providers on
rms_norm and ships certificates for them, ``opcore-cert-thief`` registers one provider
of its own and ships certificates for home's providers, one of them placed inside home's
``certificates/`` folder (listed in the thief's RECORD).
"""

from __future__ import annotations

import copy
import json
import re

import pytest

from opcore import certificates as C
from opcore.plugins import GENERAL_PLUGINS_GROUP
from opcore.testing import make_distribution, run_python

IDENTITY = "a" * 64


def _entry(provider="p", *, passed=True, counts=None, **extra):
    counts = {"pass": 3} if counts is None else counts
    return {
        "op": "o",
        "provider": provider,
        "identity": IDENTITY,
        "passed": passed,
        "counts": counts,
        **extra,
    }


def _doc(*entries, **fields):
    entries = entries or (_entry(),)
    totals: dict[str, int] = {}
    for e in entries:
        for s, n in e["counts"].items():
            totals[s] = totals.get(s, 0) + n
    doc = {
        "format": C.FORMAT,
        "format_version": C.FORMAT_VERSION,
        "device_type": "cpu",
        "mode": "quick",
        "complete": True,
        "filters": {},
        "counts": totals,
        "providers": list(entries),
    }
    doc.update(fields)
    return doc


def _covers(*docs, distribution="opcore-cert-home", provider="p"):
    certs = [C.parse(d, f"c{i}.json", distribution="opcore-cert-home") for i, d in enumerate(docs)]
    return C.coverage("o", provider, IDENTITY, "cpu", certs, distribution=distribution)


# ----------------------------------------------------------------- parse: types and values
def _set(path, value):
    def change(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _drop(path):
    def change(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


@pytest.mark.parametrize(
    "change, field",
    [
        (_set(["providers", 0, "passed"], "false"), "providers[0].passed"),
        (_set(["providers", 0, "passed"], 1), "providers[0].passed"),
        (_set(["providers", 0, "passed"], None), "providers[0].passed"),
        (_set(["mode"], "nightly"), "mode"),
        (_set(["mode"], None), "mode"),
        (_set(["format_version"], True), "format_version"),
        (_set(["format_version"], 1.0), "format_version"),
        (_set(["format_version"], "1"), "format_version"),
        (_set(["format"], ["opcore-conformance-certificate"]), "format"),
        (_set(["device_type"], ""), "device_type"),
        (_set(["device_type"], 3), "device_type"),
        (_set(["complete"], "false"), "complete"),
        (_set(["complete"], 0), "complete"),
        (_set(["filters"], []), "filters"),
        (_set(["counts"], [3]), "counts"),
        (_set(["counts"], {"pass": -1}), "counts.pass"),
        (_set(["counts"], {"pass": True}), "counts.pass"),
        (_set(["counts"], {"pass": 3.0}), "counts.pass"),
        (_set(["counts"], {"passed": 3}), "counts"),
        (_set(["stopped"], ""), "stopped"),
        (_set(["providers"], {"o": "p"}), "providers"),
        (_set(["providers", 0], "o/p"), "providers[0]"),
        (_set(["providers", 0, "op"], ""), "providers[0].op"),
        (_set(["providers", 0, "provider"], 7), "providers[0].provider"),
        (_set(["providers", 0, "identity"], "abc"), "providers[0].identity"),
        (_set(["providers", 0, "identity"], "A" * 64), "providers[0].identity"),
        (_set(["providers", 0, "counts"], {"fail": "2"}), "providers[0].counts.fail"),
        (_set(["providers", 0, "counts"], {"bogus": 1}), "providers[0].counts"),
        (_set(["providers", 0, "distribution"], 5), "providers[0].distribution"),
        (_drop(["providers", 0, "passed"]), "providers[0]"),
        (_drop(["providers", 0, "counts"]), "providers[0]"),
    ],
)
def test_parse_refuses_a_wrong_type_or_value_naming_the_field(change, field):
    doc = copy.deepcopy(_doc())
    change(doc)
    with pytest.raises(C.CertificateError, match=re.escape(f"x.json: field {field}:")):
        C.parse(doc, "x.json")


@pytest.mark.parametrize("field", ["complete", "filters", "counts"])
def test_parse_requires_the_fields_the_rules_use(field):
    doc = _doc()
    del doc[field]
    with pytest.raises(C.CertificateError, match=f"x.json: missing field.*{field}"):
        C.parse(doc, "x.json")


def test_the_error_says_what_was_given():
    doc = _doc(_entry(passed="false"))
    with pytest.raises(C.CertificateError) as err:
        C.parse(doc, "x.json")
    assert str(err.value) == (
        'x.json: field providers[0].passed: expected true or false, got the string "false"'
    )
    with pytest.raises(C.CertificateError) as err:
        C.parse({**_doc(), "mode": "nightly"}, "x.json")
    assert str(err.value) == (
        'x.json: field mode: expected "quick" or "full", got the string "nightly"'
    )


# ----------------------------------------------------------------- coverage: the rules
def test_a_valid_certificate_certifies_the_provider_of_its_own_distribution():
    cov = _covers(_doc())
    assert cov == {"status": "certified", "modes": ["quick"], "sources": ["c0.json"], "why": None}


def test_another_distributions_certificate_certifies_nothing():
    cov = _covers(_doc(), distribution="opcore-cert-other")
    assert cov["status"] == "not certified"
    assert (
        "shipped by opcore-cert-home, the provider is registered by opcore-cert-other"
        in (cov["why"])
    )
    # a certificate whose shipper is not known, or a provider whose registrant is not
    cert = C.parse(_doc(), "c.json")
    assert cert.distribution is None
    cov = C.coverage("o", "p", IDENTITY, "cpu", [cert], distribution="opcore-cert-home")
    assert cov["status"] == "not certified" and "which distribution ships it" in cov["why"]
    cov = _covers(_doc(), distribution=None)
    assert cov["status"] == "not certified" and "which distribution registers" in cov["why"]


def test_an_entry_naming_another_distribution_contradicts_its_shipper():
    cov = _covers(_doc(_entry(distribution="opcore-cert-other@1.0")))
    assert cov["status"] == "not certified"
    assert "lists it as a provider of opcore-cert-other@1.0" in cov["why"]
    # the same name in another spelling, with its version, is the same distribution
    assert _covers(_doc(_entry(distribution="Opcore_Cert.Home@0.1.0")))["status"] == "certified"


def test_a_duplicate_entry_certifies_nothing_whatever_its_order():
    failed = _entry(passed=False, counts={"fail": 1})
    for entries in ((failed, _entry()), (_entry(), failed), (_entry(), _entry())):
        cov = _covers(_doc(*entries))
        assert cov["status"] == "not certified", entries
        assert "lists o/p 2 times (providers[0], [1])" in cov["why"]
    # the duplicate of another pair leaves this one alone
    assert _covers(_doc(_entry(), _entry("q"), _entry("q")))["status"] == "certified"


def test_passed_contradicting_its_counts_certifies_nothing():
    cov = _covers(_doc(_entry(passed=True, counts={"pass": 3, "fail": 1})))
    assert cov["status"] == "not certified"
    assert "passed is true but its counts are pass 3, fail 1" in cov["why"]
    # passed with no case that passed (all unsupported) is a contradiction too
    cov = _covers(_doc(_entry(passed=True, counts={"unsupported": 4})))
    assert "passed is true but its counts are unsupported 4" in cov["why"]


def test_an_incomplete_run_certifies_nothing_unless_a_green_selection():
    # stopped before every case ran (no filter explains complete: false)
    cov = _covers(_doc(complete=False))
    assert "the run stopped before every case ran" in cov["why"]
    # a selection whose counts hold failures
    red = _doc(complete=False, filters={"ops": ["o"]}, counts={"pass": 3, "fail": 2})
    cov = _covers(red)
    assert cov["status"] == "not certified"
    assert "a selection (complete is false) with red cases (counts: fail 2)" in cov["why"]
    # a green selection certifies
    assert _covers(_doc(complete=False, filters={"ops": ["o"]}))["status"] == "certified"
    # a complete run's failures of another provider do not touch this one
    other = _entry("q", passed=False, counts={"fail": 2})
    assert _covers(_doc(_entry(), other))["status"] == "certified"


def test_a_run_that_says_it_stopped_certifies_nothing():
    cov = _covers(_doc(complete=False, filters={"ops": ["o"]}, stopped="interrupted by SIGINT"))
    assert "the run stopped early (interrupted by SIGINT)" in cov["why"]


def test_contradictory_totals_certify_nothing():
    cov = _covers(_doc(complete=True, filters={"ops": ["o"]}))
    assert "complete is true but filters are set" in cov["why"]
    cov = _covers(_doc(counts={"pass": 1}))
    assert "its providers' counts exceed the run's counts (pass 3 > 1)" in cov["why"]


def test_a_failure_in_one_certificate_outweighs_a_pass_in_another():
    failed = _doc(_entry(passed=False, counts={"fail": 1}), mode="full")
    cov = _covers(_doc(), failed)
    assert cov["status"] == "not certified"
    assert (
        cov["why"]
        == "c1.json records failures for it (fail 1) (the same identity passes in c0.json)"
    )
    # a run in which nothing held is no failure: the other one certifies
    unsupported = _doc(_entry(passed=False, counts={"unsupported": 2}), mode="full")
    assert _covers(_doc(), unsupported)["modes"] == ["quick"]


# ----------------------------------------------------------------- end to end: opcore info
PROVIDERS = (
    "p_good",
    "p_full",
    "p_string",
    "p_mode",
    "p_version",
    "p_incomplete",
    "p_incsel",
    "p_contra",
    "p_dup",
    "p_xfile",
    "p_stolen",
    "p_planted",
)

HOME = f"""
from opcore.ir import ops

PROVIDERS = {PROVIDERS!r}


def home_rms(x, weight, epsilon, variance_size=None):
    return ops.rms_norm.native(x, weight, epsilon, variance_size)


def any_args(x, weight, epsilon, variance_size=None):
    return True  # a predicate (even this one) keeps the providers after it in the chain


def register():
    for name in PROVIDERS:
        if name not in ops.rms_norm.impls:
            ops.rms_norm.register_impl(name, supports_args=any_args)(home_rms)
"""

THIEF = """
from opcore.ir import ops


def thief_rms(x, weight, epsilon, variance_size=None):
    return ops.rms_norm.native(x, weight, epsilon, variance_size)


def register():
    if "p_thief" not in ops.rms_norm.impls:
        ops.rms_norm.register_impl("p_thief")(thief_rms)
"""

PRIORITY = {"OPCORE_IR_OP_PRIORITY": "rms_norm=" + ",".join([*PROVIDERS, "p_thief", "native"])}


def _real(identities, provider, *, passed=True, counts=None):
    entry = _entry(provider, passed=passed, counts=counts)
    return {**entry, "op": "rms_norm", "identity": identities[provider]}


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    site = tmp_path_factory.mktemp("cert-site")
    home_init = {"cert_home/__init__.py": HOME}
    home_eps = {GENERAL_PLUGINS_GROUP: {"cert_home": "cert_home:register"}}
    make_distribution(site, "opcore-cert-home", entry_points=home_eps, files=home_init)
    proc = run_python(
        """
        import json
        from opcore.platforms.kernels import ensure_kernels_loaded
        from opcore.ir import ops
        ensure_kernels_loaded()
        print(json.dumps({p: i.identity_hash() for p, i in ops.rms_norm.impls.items()}))
        """,
        site=site,
    )
    assert proc.returncode == 0, proc.stderr
    ids = json.loads(proc.stdout)
    thief_init = {"cert_thief/__init__.py": THIEF}
    thief_eps = {GENERAL_PLUGINS_GROUP: {"cert_thief": "cert_thief:register"}}
    make_distribution(site, "opcore-cert-thief", entry_points=thief_eps, files=thief_init)
    proc = run_python(
        """
        import json
        from opcore.platforms.kernels import ensure_kernels_loaded
        from opcore.ir import ops
        ensure_kernels_loaded()
        print(ops.rms_norm.impls["p_thief"].identity_hash())
        """,
        site=site,
    )
    assert proc.returncode == 0, proc.stderr
    ids["p_thief"] = proc.stdout.strip()

    def doc(*entries, **fields):
        return json.dumps(_doc(*entries, **fields))

    selection = {"ops": ["rms_norm"], "providers": list(PROVIDERS)}
    home = {
        # valid: a green selection, and a complete full run with another provider's failure
        "good.json": doc(
            _real(ids, "p_good"), _real(ids, "p_xfile"), complete=False, filters=selection
        ),
        "full.json": doc(
            _real(ids, "p_full"),
            _real(ids, "p_xfile", passed=False, counts={"fail": 2}),
            mode="full",
        ),
        "string_passed.json": doc({**_real(ids, "p_string"), "passed": "false"}),
        "unknown_mode.json": doc(_real(ids, "p_mode"), mode="nightly"),
        "version_true.json": doc(_real(ids, "p_version"), format_version=True),
        "incomplete.json": doc(
            _real(ids, "p_incomplete"), complete=False, counts={"pass": 3, "fail": 2}
        ),
        "incomplete_selection.json": doc(
            _real(ids, "p_incsel"),
            complete=False,
            filters=selection,
            counts={"pass": 3, "fail": 2},
        ),
        "contradiction.json": doc(_real(ids, "p_contra", counts={"pass": 3, "fail": 1})),
        "duplicate.json": doc(
            _real(ids, "p_dup", passed=False, counts={"fail": 1}), _real(ids, "p_dup")
        ),
    }
    # Installed again, now with its certificates listed in its RECORD like a wheel's.
    make_distribution(
        site,
        "opcore-cert-home",
        entry_points=home_eps,
        files={
            **home_init,
            **{f"cert_home/certificates/{name}": text for name, text in home.items()},
        },
    )
    # The thief: its own provider, home's p_stolen in its own folder, and a file it
    # installs into home's folder for p_planted.
    make_distribution(
        site,
        "opcore-cert-thief",
        entry_points=thief_eps,
        files={
            **thief_init,
            "cert_thief/certificates/stolen.json": doc(
                _real(ids, "p_stolen"), _real(ids, "p_thief")
            ),
            "cert_home/certificates/planted.json": doc(_real(ids, "p_planted")),
        },
    )
    code = "from opcore.cli import main; raise SystemExit(main(['info', '--json']))"
    proc = run_python(code, site=site, env=PRIORITY, timeout=180)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)["certificates"]
    text = run_python(
        "from opcore.cli import main; raise SystemExit(main(['info']))",
        site=site,
        env=PRIORITY,
        timeout=180,
    )
    assert text.returncode == 0, text.stderr
    return data, text.stdout


def _cov(certificates, provider):
    return certificates[0]["ops"]["rms_norm"][provider]


def _error(certificates, name):
    (line,) = [e for e in certificates[0]["errors"] if f"/{name}:" in e]
    return line


def test_valid_certificates_still_certify(certificates):
    assert _cov(certificates, "p_good")["status"] == "certified"
    assert _cov(certificates, "p_good")["modes"] == ["quick"]
    assert _cov(certificates, "p_good")["sources"] == ["cert_home/certificates/good.json"]
    assert _cov(certificates, "p_good")["distribution"] == "opcore-cert-home"
    # a complete run's red case of another provider leaves this one certified
    assert _cov(certificates, "p_full")["modes"] == ["full"]
    # the thief's own provider, from the thief's own certificate
    assert _cov(certificates, "p_thief")["status"] == "certified"
    assert _cov(certificates, "p_thief")["distribution"] == "opcore-cert-thief"


def test_a_third_party_package_cannot_certify_another_distributions_provider(certificates):
    cov = _cov(certificates, "p_stolen")
    assert cov["status"] == "not certified"
    assert cov["why"] == (
        "cert_thief/certificates/stolen.json is shipped by opcore-cert-thief, the provider "
        "is registered by opcore-cert-home (a package certifies only its own distribution's "
        "providers)"
    )


def test_a_file_installed_into_another_package_belongs_to_its_installer(certificates):
    cov = _cov(certificates, "p_planted")
    assert cov["status"] == "not certified"
    assert "cert_home/certificates/planted.json is shipped by opcore-cert-thief" in cov["why"]


def test_passed_as_a_string_makes_the_file_unusable(certificates):
    cov = _cov(certificates, "p_string")
    assert cov["status"] == "not certified" and cov["why"] == "no certificate lists it"
    assert _error(certificates, "string_passed.json") == (
        "cert_home/certificates/string_passed.json: field providers[0].passed: expected "
        'true or false, got the string "false"'
    )


def test_an_unknown_mode_makes_the_file_unusable(certificates):
    assert _cov(certificates, "p_mode")["status"] == "not certified"
    assert 'field mode: expected "quick" or "full", got the string "nightly"' in _error(
        certificates, "unknown_mode.json"
    )


def test_format_version_true_makes_the_file_unusable(certificates):
    assert _cov(certificates, "p_version")["status"] == "not certified"
    assert "field format_version: expected the integer 1, got the boolean true" in _error(
        certificates, "version_true.json"
    )


def test_counts_with_failures_while_incomplete_certify_nothing(certificates):
    for provider, name, reason in (
        ("p_incomplete", "incomplete.json", "the run stopped before every case ran"),
        ("p_incsel", "incomplete_selection.json", "with red cases (counts: fail 2)"),
    ):
        cov = _cov(certificates, provider)
        assert cov["status"] == "not certified"
        assert f"cert_home/certificates/{name} certifies nothing: " in cov["why"]
        assert reason in cov["why"]
        assert "certifies nothing" in _error(certificates, name)


def test_passed_contradicting_its_counts_is_not_certified(certificates):
    cov = _cov(certificates, "p_contra")
    assert cov["status"] == "not certified"
    assert "passed is true but its counts are pass 3, fail 1" in cov["why"]


def test_a_failed_entry_followed_by_a_passed_duplicate_is_not_certified(certificates):
    cov = _cov(certificates, "p_dup")
    assert cov["status"] == "not certified"
    assert "lists rms_norm/p_dup 2 times" in cov["why"]


def test_a_failure_in_another_certificate_outweighs_a_pass(certificates):
    cov = _cov(certificates, "p_xfile")
    assert cov["status"] == "not certified"
    assert cov["why"] == (
        "cert_home/certificates/full.json records failures for it (fail 2) (the same "
        "identity passes in cert_home/certificates/good.json)"
    )


def test_the_human_output_says_why(certificates):
    _, text = certificates
    section = text[text.index("Certificates (providers in use") :].split("\n\n")[0]
    (line,) = [ln for ln in section.splitlines() if " p_stolen " in ln]
    assert "not certified: cert_thief/certificates/stolen.json is shipped by" in line
    assert "  warning: cert_home/certificates/version_true.json: field format_version" in section
