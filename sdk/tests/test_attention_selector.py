"""The one selection algorithm: explicit choices are validated and never replaced; platform
candidates are tried in order; failures list every candidate's reasons; plugins override
class paths through `register_backend`."""

from __future__ import annotations

import dataclasses
import json
import logging
import textwrap

import pytest
import torch

from opcore.attention import (
    AttentionSelectionError,
    AttentionSelectorConfig,
    UnknownBackendError,
    clear_override,
    is_overridden,
    probe_selection,
    register_backend,
    select_backend,
    selection_info,
)
from opcore.attention.backends.torch_native import TorchNativeBackend
from opcore.attention.selector import clear_selection_records
from opcore.config import create_config
from opcore.platforms import Platform
from opcore.testing.distributions import make_distribution, run_python


class ListedPlatform(Platform):
    """A host-CPU platform whose attention candidates a test chooses."""

    name = "listed"
    device_name = "host"
    device_type = "cpu"

    def __init__(self, candidates, mapping=None):
        self.candidates = list(candidates)
        self.mapping = mapping or {}

    def device_count(self):
        return 1

    def get_device_name(self, index=0):
        return "host"

    def get_device_total_memory(self, index=0):
        return 1 << 30

    def get_attn_backend_candidates(self, cfg):
        return list(self.candidates)

    def get_attn_backend_cls(self, selected, cfg):
        if selected in self.mapping:
            return self.mapping[selected]
        return super().get_attn_backend_cls(selected, cfg)


class MyNative(TorchNativeBackend):
    name = "MY_NATIVE"


class HalfOnly(TorchNativeBackend):
    name = "HALF_ONLY"
    supported_dtypes = (torch.float16,)


class NotABackend:
    pass


CFG = AttentionSelectorConfig(head_size=64, num_heads=8, num_kv_heads=2, dtype=torch.bfloat16, block_size=16)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    clear_selection_records()
    yield
    for name in ("TORCH_NATIVE", "HALF_ONLY", "MY_ATTN", "BROKEN", "NOT_A_BACKEND", "FLASH_ATTN"):
        clear_override(name)
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
    assert "has no implementation registered" in tried["FLASH_ATTN"][0]
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
    sel = select(ListedPlatform(["TORCH_NATIVE"]), backend="HALF_ONLY", cfg=dataclasses.replace(CFG, dtype=torch.float16))
    assert sel.selected == "HALF_ONLY" and sel.source == "argument"


def test_explicit_config_and_environment_are_explicit_too():
    platform = ListedPlatform(["TORCH_NATIVE"])
    with pytest.raises(AttentionSelectionError, match=r"from OpcoreConfig.attention.backend / OPCORE_ATTENTION_BACKEND"):
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
    platform = ListedPlatform(["TRITON_PAGED", "HALF_ONLY", "FLASH_ATTN", "BROKEN", "NOT_A_BACKEND"])
    with pytest.raises(AttentionSelectionError) as err:
        select(platform)
    msg = str(err.value)
    assert msg.startswith("No valid attention backend for")
    assert "TRITON_PAGED: [device type 'cpu' not supported (supported: cuda, xpu)]" in msg
    assert "HALF_ONLY: [dtype bfloat16 not supported (supported: float16)]" in msg
    assert "FLASH_ATTN: [Attention backend FLASH_ATTN has no implementation registered" in msg
    assert "BROKEN: [cannot load no_such_package.mod.Backend: ModuleNotFoundError" in msg
    assert "NOT_A_BACKEND: [cannot load" in msg and "is not an opcore.attention.AttentionBackend subclass" in msg
    info = selection_info()["selections"]
    assert info[-1]["selected"] is None and info[-1]["error"] == msg
    assert [c["name"] for c in info[-1]["candidates"]] == platform.candidates


def test_empty_candidate_list_is_an_error():
    with pytest.raises(AttentionSelectionError, match="empty get_attn_backend_candidates"):
        select(ListedPlatform([]))


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownBackendError, match=r"Unknown attention backend 'NOPE'. Known backends: TORCH_NATIVE, TRITON_PAGED"):
        select(ListedPlatform(["TORCH_NATIVE"]), backend="NOPE")


def test_register_backend_overrides_a_class_path_and_clear_restores_it():
    platform = ListedPlatform(["TORCH_NATIVE"])
    register_backend("TORCH_NATIVE", path(MyNative))
    assert is_overridden("TORCH_NATIVE")
    assert select(platform).backend_cls is MyNative
    clear_override("TORCH_NATIVE")
    assert select(platform).backend_cls is TorchNativeBackend


def test_register_backend_as_decorator_adds_a_name():
    @register_backend("my_attn")
    class Local(TorchNativeBackend):
        name = "MY_ATTN"

    # A class defined inside a function has no importable path; a platform resolves it.
    assert selection_info()["registry"]["MY_ATTN"]["class_path"].endswith("Local")
    register_backend("MY_ATTN", path(MyNative))
    assert select(ListedPlatform(["MY_ATTN"])).backend_cls is MyNative


def test_platform_maps_a_generic_name_to_its_own_class():
    platform = ListedPlatform(["FLASH_ATTN"], mapping={"FLASH_ATTN": path(MyNative)})
    sel = select(platform)
    assert sel.selected == "FLASH_ATTN" and sel.backend_cls is MyNative


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


def test_a_general_plugin_overrides_a_backend_in_a_real_distribution(tmp_path):
    """An installed distribution's ``opcore.general_plugins`` entry point registers its own
    class for TORCH_NATIVE; a fresh interpreter's selection returns that class."""
    site = tmp_path / "site"
    make_distribution(
        site,
        "attn-override-plugin",
        entry_points={"opcore.general_plugins": {"attn_override": "attn_override_plugin:register"}},
        files={
            "attn_override_plugin/__init__.py": """
                from opcore.attention import register_backend

                def register():
                    register_backend("TORCH_NATIVE", "attn_override_plugin.backend.PluginNative")
            """,
            "attn_override_plugin/backend.py": """
                from opcore.attention.backends.torch_native import TorchNativeBackend

                class PluginNative(TorchNativeBackend):
                    name = "TORCH_NATIVE"
            """,
        },
    )
    code = textwrap.dedent(
        """
        import json, torch
        from opcore.attention import AttentionSelectorConfig, select_backend, selection_info
        sel = select_backend(AttentionSelectorConfig(head_size=64, num_heads=4, num_kv_heads=4, dtype=torch.float32))
        print(json.dumps(selection_info()))
        """
    )
    proc = run_python(code, site=site)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["registry"]["TORCH_NATIVE"]["overridden"] is True
    assert info["selections"][0]["class_path"] == "attn_override_plugin.backend.PluginNative"
    assert info["selections"][0]["selected"] == "TORCH_NATIVE"


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
    ok = probe_selection(platform=ListedPlatform(["TORCH_NATIVE"]), config=create_config(platform, env={}))
    assert ok["selected"] == "TORCH_NATIVE" and ok["config"]["num_kv_heads"] == 8
