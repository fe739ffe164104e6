"""The one selection algorithm: explicit choices are validated and never replaced; platform
candidates are tried in order; failures list every candidate's reasons; the registry alone
maps a name to its class, one class per name."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from opcore.attention import (
    AttentionSelectionError,
    AttentionSelectorConfig,
    UnknownBackendError,
    probe_selection,
    register_backend,
    select_backend,
    selection_info,
)
from opcore.attention.backends.torch_native import TorchNativeBackend
from opcore.attention.registry import backend_class_path
from opcore.platforms import Platform
from opcore.settings import create_config
from opcore.testing.attention import clear_selection_records, unregister_backend


class ListedPlatform(Platform):
    """A host-CPU platform whose attention candidates a test chooses."""

    name = "listed"
    device_name = "host"
    device_type = "cpu"

    def __init__(self, candidates):
        self.candidates = list(candidates)

    def device_count(self):
        return 1

    def get_device_name(self, index=0):
        return "host"

    def get_device_total_memory(self, index=0):
        return 1 << 30

    def get_attn_backend_candidates(self, cfg):
        return list(self.candidates)


class MyNative(TorchNativeBackend):
    name = "MY_NATIVE"


class HalfOnly(TorchNativeBackend):
    name = "HALF_ONLY"
    supported_dtypes = (torch.float16,)


class NotABackend:
    pass


CFG = AttentionSelectorConfig(
    head_size=64, num_heads=8, num_kv_heads=2, dtype=torch.bfloat16, block_size=16
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    clear_selection_records()
    yield
    for name in ("HALF_ONLY", "MY_ATTN", "BROKEN", "NOT_A_BACKEND", "FLASH_ATTN"):
        unregister_backend(name)
    clear_selection_records()


def select(platform, backend=None, env=None, cfg=CFG):
    config = create_config(platform, env=env or {})
    return select_backend(cfg, backend, platform=platform, config=config)


def path(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_first_valid_candidate_wins_and_later_ones_are_not_tried():
    register_backend("HALF_ONLY", path(HalfOnly))
    register_backend("BROKEN", "no_such_package.mod.Backend")
    platform = ListedPlatform(["FLASH_ATTN", "TRITON_PAGED", "HALF_ONLY", "TORCH_NATIVE", "BROKEN"])
    sel = select(platform)
    assert sel.selected == "TORCH_NATIVE" and sel.backend_cls is TorchNativeBackend
    assert sel.source == "platform"
    tried = {c.name: c.reasons for c in sel.candidates}
    assert list(tried) == ["FLASH_ATTN", "TRITON_PAGED", "HALF_ONLY", "TORCH_NATIVE"]
    # The core reserves no vendor name: one nobody registered is a reason like any other.
    assert tried["FLASH_ATTN"][0].startswith(
        "Unknown attention backend 'FLASH_ATTN'. Known backends:"
    )
    assert tried["TRITON_PAGED"] == ["device type 'cpu' not supported (supported: cuda, xpu)"]
    assert tried["HALF_ONLY"] == ["dtype bfloat16 not supported (supported: float16)"]
    assert tried["TORCH_NATIVE"] == []


def test_explicit_argument_is_validated_and_never_replaced():
    platform = ListedPlatform(["TORCH_NATIVE"])
    with pytest.raises(AttentionSelectionError) as err:
        select(platform, backend="triton_paged")
    msg = str(err.value)
    assert "Selected attention backend TRITON_PAGED (from the backend argument)" in msg
    assert "device type 'cpu' not supported" in msg
    assert "never replaced" in msg
    # A valid explicit choice is used even when the platform would not have offered it.
    register_backend("HALF_ONLY", path(HalfOnly))
    sel = select(
        ListedPlatform(["TORCH_NATIVE"]),
        backend="HALF_ONLY",
        cfg=dataclasses.replace(CFG, dtype=torch.float16),
    )
    assert sel.selected == "HALF_ONLY" and sel.source == "argument"


def test_explicit_config_and_environment_are_explicit_too():
    platform = ListedPlatform(["TORCH_NATIVE"])
    with pytest.raises(
        AttentionSelectionError,
        match=r"from OpcoreConfig.attention.backend / OPCORE_ATTENTION_BACKEND",
    ):
        select(platform, env={"OPCORE_ATTENTION_BACKEND": "triton_paged"})
    # The argument outranks the configured name.
    sel = select(platform, backend="TORCH_NATIVE", env={"OPCORE_ATTENTION_BACKEND": "triton_paged"})
    assert sel.selected == "TORCH_NATIVE" and sel.source == "argument"
    config = create_config(platform, env={}, attention_backend="torch_native")
    sel = select_backend(CFG, platform=ListedPlatform(["TRITON_PAGED"]), config=config)
    assert sel.selected == "TORCH_NATIVE" and sel.source == "config"


def test_no_valid_candidate_lists_every_candidate_with_reasons():
    register_backend("HALF_ONLY", path(HalfOnly))
    register_backend("BROKEN", "no_such_package.mod.Backend")
    register_backend("NOT_A_BACKEND", path(NotABackend))
    platform = ListedPlatform(
        ["TRITON_PAGED", "HALF_ONLY", "FLASH_ATTN", "BROKEN", "NOT_A_BACKEND"]
    )
    with pytest.raises(AttentionSelectionError) as err:
        select(platform)
    msg = str(err.value)
    assert msg.startswith("No valid attention backend for")
    assert "TRITON_PAGED: [device type 'cpu' not supported (supported: cuda, xpu)]" in msg
    assert "HALF_ONLY: [dtype bfloat16 not supported (supported: float16)]" in msg
    assert "FLASH_ATTN: [Unknown attention backend 'FLASH_ATTN'" in msg
    assert "BROKEN: [cannot load no_such_package.mod.Backend: ModuleNotFoundError" in msg
    assert (
        "NOT_A_BACKEND: [cannot load" in msg
        and "is not an opcore.attention.AttentionBackend subclass" in msg
    )
    info = selection_info()["selections"]
    assert info[-1]["selected"] is None and info[-1]["error"] == msg
    assert [c["name"] for c in info[-1]["candidates"]] == platform.candidates


def test_empty_candidate_list_is_an_error():
    with pytest.raises(AttentionSelectionError, match="empty get_attn_backend_candidates"):
        select(ListedPlatform([]))


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(
        UnknownBackendError,
        match=r"Unknown attention backend 'NOPE'. Known backends: TORCH_NATIVE, TRITON_PAGED",
    ):
        select(ListedPlatform(["TORCH_NATIVE"]), backend="NOPE")


def test_a_core_name_keeps_its_class():
    """A plugin cannot swap the class behind a core name (TORCH_NATIVE is the reference
    every backend is checked against): it registers a name of its own."""
    with pytest.raises(
        ValueError, match=r"TORCH_NATIVE is a core attention backend .* name of its own"
    ):
        register_backend("torch_native", path(MyNative))
    with pytest.raises(ValueError, match="cannot be unregistered"):
        unregister_backend("TORCH_NATIVE")
    assert backend_class_path("TORCH_NATIVE") == path(TorchNativeBackend)
    assert select(ListedPlatform(["TORCH_NATIVE"])).backend_cls is TorchNativeBackend


def test_a_name_has_one_class():
    register_backend("MY_ATTN", path(MyNative))
    register_backend("my_attn", path(MyNative))  # the same path again: a no-op
    with pytest.raises(
        ValueError,
        match=r"MY_ATTN is already registered to .*MyNative; a backend name has one class",
    ):
        register_backend("MY_ATTN", path(HalfOnly))
    assert select(ListedPlatform(["MY_ATTN"])).backend_cls is MyNative
    info = selection_info()["registry"]
    assert info["MY_ATTN"] == {"class_path": path(MyNative), "origin": "plugin"}
    assert info["TORCH_NATIVE"] == {"class_path": path(TorchNativeBackend), "origin": "core"}


def test_register_backend_as_decorator():
    register_backend("my_attn")(MyNative)
    assert backend_class_path("MY_ATTN") == path(MyNative)
    unregister_backend("MY_ATTN")
    # A class defined inside a function has no importable path: refused, not stored.
    with pytest.raises(ValueError, match="defined inside a function"):

        @register_backend("my_attn")
        class Local(TorchNativeBackend):
            pass

    with pytest.raises(UnknownBackendError):
        backend_class_path("MY_ATTN")


def test_choice_and_rejections_are_logged_and_recorded(caplog):
    register_backend("HALF_ONLY", path(HalfOnly))
    with caplog.at_level(logging.INFO, logger="opcore.attention"):
        select(ListedPlatform(["HALF_ONLY", "TORCH_NATIVE"]))
    text = caplog.text
    assert "Using attention backend TORCH_NATIVE (platform candidate)" in text
    assert "rejected: HALF_ONLY: [dtype bfloat16 not supported (supported: float16)]" in text
    record = selection_info()["selections"][-1]
    assert record["selected"] == "TORCH_NATIVE"
    assert record["class_path"] == path(TorchNativeBackend)
    assert record["config"]["dtype"] == "bfloat16" and record["config"]["device_type"] == "cpu"
    assert record["candidates"][0] == {
        "name": "HALF_ONLY",
        "class_path": path(HalfOnly),
        "valid": False,
        "reasons": ["dtype bfloat16 not supported (supported: float16)"],
    }


def test_probe_selection_reports_a_failure_as_data():
    platform = ListedPlatform(["TRITON_PAGED"])
    record = probe_selection(CFG, platform=platform, config=create_config(platform, env={}))
    assert record["selected"] is None
    assert record["error"].startswith("No valid attention backend")
    assert record["candidates"] == [
        {
            "name": "TRITON_PAGED",
            "class_path": "opcore.attention.backends.triton_paged.TritonPagedBackend",
            "valid": False,
            "reasons": ["device type 'cpu' not supported (supported: cuda, xpu)"],
        }
    ]
    ok = probe_selection(
        platform=ListedPlatform(["TORCH_NATIVE"]), config=create_config(platform, env={})
    )
    assert ok["selected"] == "TORCH_NATIVE" and ok["config"]["num_kv_heads"] == 8


def test_test_helpers_live_in_opcore_testing_only():
    """Forgetting a name and the selection history is for tests: `opcore.testing.attention`
    offers it (as `opcore.testing.ir` offers `unregister_op`), and the package
    `opcore.attention` does not export it."""
    import opcore.attention
    import opcore.testing.attention as helpers

    for name in ("unregister_backend", "clear_selection_records"):
        assert not hasattr(opcore.attention, name)
        assert name not in opcore.attention.__all__
        assert callable(getattr(helpers, name))

    register_backend("MY_ATTN", path(MyNative))
    assert select(ListedPlatform(["MY_ATTN"])).backend_cls is MyNative
    assert selection_info()["selections"]
    unregister_backend("MY_ATTN")
    assert "MY_ATTN" not in selection_info()["registry"]
    with pytest.raises(UnknownBackendError):
        backend_class_path("MY_ATTN")
    clear_selection_records()
    assert selection_info()["selections"] == []
