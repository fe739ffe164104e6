"""The priority merge rule, warnings, set_priority, explain and dispatch logging."""

from __future__ import annotations

import logging
import sys
import warnings

import pytest
import torch

from opcore.ir import PriorityWarning, kernel_load_errors, ops
from opcore.platforms import UnspecifiedPlatform
from opcore.settings import create_config, set_current_config
from opcore.testing.ir import temporary_impl, temporary_op


def ir_prio_op(x: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
    return x * factor


def _provider(tag: float):
    def ir_prio_op(x, factor=1.0):
        return x * factor + tag

    return ir_prio_op


def _small_only(x, factor=1.0):
    return x.numel() <= 4


class DefaultsPlatform(UnspecifiedPlatform):
    """A platform whose default priority names providers (a real Platform subclass)."""

    def __init__(self, defaults):
        self.defaults = defaults

    def get_default_ir_op_priority(self, config):
        return self.defaults


@pytest.fixture
def op():
    with temporary_op(ir_prio_op) as op:
        yield op


def test_no_priority_means_native(op):
    assert op.effective_priority() == ["native"]
    assert op.dispatch(torch.ones(2)).provider == "native"


def test_user_list_then_platform_default_then_native(op):
    with (
        temporary_impl(op, "fast", _provider(1.0), supports_args=_small_only),
        temporary_impl(op, "other", _provider(2.0)),
    ):
        config = create_config(ir_op_priority={"ir_prio_op": ["fast"]})
        d = op.decision(config, platform=DefaultsPlatform({"ir_prio_op": ["other", "fast"]}))
        assert d.names == ["fast", "other"]  # 'other' takes every argument: native not needed
        assert d.platform_default == ["other", "fast"]
        d = op.decision(create_config(), platform=DefaultsPlatform({"ir_prio_op": ["fast"]}))
        assert d.names == ["fast", "native"] and d.native_appended


def test_unknown_provider_in_priority_lists_registered(op):
    with set_current_config(create_config(ir_op_priority={"ir_prio_op": ["nope", "native"]})):
        with pytest.raises(ValueError) as info:
            op(torch.ones(2))
    message = str(info.value)
    assert "'nope'" in message and "registered providers: native" in message
    with pytest.raises(ValueError, match="'nope'"):
        with op.set_priority(["nope"]):
            pass


def test_native_appended_with_warning_when_no_provider_takes_all_args(op):
    with temporary_impl(op, "fast", _provider(1.0), supports_args=_small_only):
        with set_current_config(create_config(ir_op_priority={"ir_prio_op": ["fast"]})):
            with pytest.warns(PriorityWarning, match="'native' was appended"):
                assert op.effective_priority() == ["fast", "native"]
            small, big = torch.zeros(2), torch.zeros(8)
            assert op.dispatch(small).provider == "fast"
            assert op.dispatch(big).provider == "native"
            assert torch.equal(op(small), torch.ones(2))
            assert torch.equal(op(big), torch.zeros(8))


def test_set_priority_restores_previous(op):
    with temporary_impl(op, "a", _provider(1.0)), temporary_impl(op, "b", _provider(2.0)):
        x = torch.zeros(1)
        assert op.dispatch(x).provider == "native"
        with op.set_priority(["a"]):
            assert op.dispatch(x).provider == "a"
            with op.set_priority(["b", "a"]):
                assert op.effective_priority() == ["b"]
                assert op(x).item() == 2.0
            assert op.dispatch(x).provider == "a"
        assert op.dispatch(x).provider == "native"
        with pytest.raises(RuntimeError, match="boom"):
            with op.set_priority(["b"]):
                raise RuntimeError("boom")
        assert op.dispatch(x).provider == "native"


def test_config_change_invalidates_cache(op):
    with temporary_impl(op, "a", _provider(1.0)):
        x = torch.zeros(1)
        assert op(x).item() == 0.0
        with set_current_config(create_config(ir_op_priority={"ir_prio_op": ["a"]})):
            assert op(x).item() == 1.0
        assert op(x).item() == 0.0


def test_env_priority_reaches_dispatch(op):
    with temporary_impl(op, "a", _provider(1.0)):
        config = create_config(env={"OPCORE_IR_OP_PRIORITY": "ir_prio_op=a,native"})
        with set_current_config(config):
            assert op.effective_priority() == ["a"]
            assert op.dispatch(torch.zeros(1)).provider == "a"


def test_unsupported_providers_skipped_and_warned_once(op):
    with temporary_impl(op, "absent", _provider(1.0), supported=False):
        platform = DefaultsPlatform({"ir_prio_op": ["absent", "missing"]})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            d = op.decision(create_config(), platform=platform)
            op.decision(create_config(), platform=platform)
        messages = [str(w.message) for w in caught if issubclass(w.category, PriorityWarning)]
        assert len(messages) == 2, messages  # once each, not once per decision
        assert any("'absent'" in m and "not supported" in m for m in messages)
        assert any("'missing'" in m and "not registered" in m for m in messages)
        assert d.names == ["native"]
        assert d.skipped["absent"].startswith("not supported")


def test_user_named_unsupported_provider_warned(op):
    with temporary_impl(op, "nohw", _provider(1.0), supported=False):
        with op.set_priority(["nohw", "native"]), pytest.warns(PriorityWarning, match="'nohw'"):
            assert op.effective_priority() == ["native"]


def test_explain_reports_each_provider(op):
    with (
        temporary_impl(op, "fast", _provider(1.0), supports_args=_small_only),
        temporary_impl(op, "spare", _provider(2.0)),
        temporary_impl(op, "nohw", _provider(3.0), supported=False),
    ):
        with op.set_priority(["fast", "native"]):
            e = op.explain(torch.zeros(8))
            status = {p["provider"]: p["status"] for p in e.providers}
            assert e.selected == "native"
            assert status == {
                "fast": "tried",
                "native": "selected",
                "spare": "not in list",
                "nohw": "not supported",
            }
            assert "supports_args returned False" in str(e)
            assert op.explain(torch.zeros(2)).selected == "fast"


def test_log_dispatch(op, monkeypatch, caplog):
    monkeypatch.setenv("OPCORE_LOG_DISPATCH", "1")
    from opcore.ir import invalidate_caches

    invalidate_caches()
    with caplog.at_level(logging.INFO, logger="opcore.ir.dispatch"):
        op(torch.zeros(3))
    assert any("ir_prio_op((3,):float32) -> native" in r.getMessage() for r in caplog.records)
    monkeypatch.delenv("OPCORE_LOG_DISPATCH")
    invalidate_caches()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="opcore.ir.dispatch"):
        op(torch.zeros(3))
    assert not caplog.records


def test_platform_kernels_loaded_before_first_dispatch():
    ops.rms_norm.effective_priority()
    # The cpu platform imports its IR provider module from import_ir_kernels.
    assert "opcore_plugin_cpu.ipex_provider" in sys.modules
    assert kernel_load_errors() == []


def test_priority_for_unknown_op_is_warned(op):
    config = create_config(ir_op_priority={"ir_prio_typo_op": ["native"]})
    with set_current_config(config), pytest.warns(PriorityWarning, match="'ir_prio_typo_op'"):
        op(torch.ones(1))
