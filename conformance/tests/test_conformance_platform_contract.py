"""A planted out-of-tree platform (a real installed distribution) whose contract is broken in
four ways; the suite runs through ``python -m opcore conformance`` (the core CLI, which
imports the suite lazily) and default resolution, where the out-of-tree platform wins."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def platform_run(planted_site, tmp_path_factory, run_suite, read_statuses):
    report_dir = tmp_path_factory.mktemp("platform") / "reports"
    proc = run_suite(
        ["--checks", "platform", "--no-progress"],
        site=planted_site,
        report_dir=report_dir,
        module="opcore conformance",
    )
    return proc, read_statuses(report_dir)


def test_platform_claiming_an_unusable_dtype_fails(platform_run):
    proc, records = platform_run
    assert proc.returncode == 1
    assert records["platform.dtype[float8_e4m3fn]"]["status"] == "fail"
    assert "float8_e4m3fn" in records["platform.dtype[float8_e4m3fn]"]["message"]
    assert records["platform.dtype[float32]"]["status"] == "pass"


def test_stale_and_misspelled_members_are_flagged(platform_run):
    _, records = platform_run
    rec = records["platform.overrides"]
    assert rec["status"] == "fail"
    assert "get_device_nmae" in rec["message"] and "'get_device_name'?" in rec["message"]
    assert "is_cuda" in rec["message"]


def test_signature_the_core_cannot_call_is_flagged(platform_run):
    _, records = platform_run
    assert records["platform.signatures[get_device_total_memory]"]["status"] == "fail"
    assert "'unit'" in records["platform.signatures[get_device_total_memory]"]["message"]
    assert records["platform.signatures[get_device_name]"]["status"] == "pass"


def test_sound_parts_of_the_contract_pass(platform_run):
    _, records = platform_run
    for cid in (
        "platform.members",
        "platform.identity",
        "platform.config_hooks",
        "platform.priorities[eager]",
        "platform.kernels",
    ):
        assert records[cid]["status"] == "pass", records[cid]
    assert records["platform.members"]["id"] == "platform.members"


# --------------------------------------------------------------------------- plugin API 2.0
# The resolver refuses a 1.x platform before the suite could run on it, so the suite's own
# checks of the same rules are exercised directly on real platform instances here.
def _contract_ctx(cls):
    from types import SimpleNamespace

    return SimpleNamespace(platform=cls())


def test_removed_forward_chain_member_is_flagged_with_the_migration():
    from opcore_conformance.case import CheckFailed
    from opcore_conformance.checks import platform_contract as pc
    from opcore_plugin_cpu.platform import CpuPlatform

    # a 1.x-style forward chain (any public member naming forward; the 1.x name is not
    # written in the repository, see sdk/tests/test_plugin_api_2.py)
    class LegacyPlatform(CpuPlatform):
        forward_chain = ("forward_acme", "forward_native")

    with pytest.raises(CheckFailed) as info:
        pc._overrides(_contract_ctx(LegacyPlatform), None)
    message = str(info.value)
    assert "LegacyPlatform.forward_chain: removed in plugin API 2.0" in message
    assert "the 1.x forward chain" in message
    assert "docs/design.md#plugin-api-2-0" in message


def test_identity_requires_a_plugin_api_range_covering_the_core():
    from opcore_conformance.case import CheckFailed
    from opcore_conformance.checks import platform_contract as pc
    from opcore_plugin_cpu.platform import CpuPlatform

    class OldPlatform(CpuPlatform):
        plugin_api = ("1.0", "2.0")

    with pytest.raises(CheckFailed) as info:
        pc._identity(_contract_ctx(OldPlatform), None)
    message = str(info.value)
    assert "plugin API 2.0 is outside plugin_api" in message
    assert "written for plugin API 1.x" in message and "opcore.ir providers" in message
    assert pc._identity(_contract_ctx(CpuPlatform), None) == {}


def test_attention_candidates_must_be_registered_names():
    """The registry alone maps a candidate name to its class: a name nobody registered fails
    the check with how to register it; a platform still mapping names itself is flagged."""
    from opcore_conformance.case import CheckFailed
    from opcore_conformance.checks import platform_contract as pc
    from opcore_plugin_cpu.platform import CpuPlatform

    class UnregisteredName(CpuPlatform):
        def get_attn_backend_candidates(self, cfg):
            return ["NOBODY_ATTN", "TORCH_NATIVE"]

    with pytest.raises(CheckFailed) as info:
        pc._attention(_contract_ctx(UnregisteredName), None)
    message = str(info.value)
    assert "candidate 'NOBODY_ATTN': Unknown attention backend 'NOBODY_ATTN'" in message
    assert "register it with register_backend in import_kernels" in message
    assert pc._attention(_contract_ctx(CpuPlatform), None)["classes"] == {
        "TORCH_NATIVE": "opcore.attention.backends.torch_native.TorchNativeBackend"
    }

    class MappingPlatform(CpuPlatform):
        def get_attn_backend_cls(self, selected, cfg):
            return "pkg.Backend"

    with pytest.raises(CheckFailed) as info:
        pc._overrides(_contract_ctx(MappingPlatform), None)
    assert "MappingPlatform.get_attn_backend_cls: removed in plugin API 2.0" in str(info.value)
