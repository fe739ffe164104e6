"""OpcoreConfig: precedence, hook order, and errors that quote the malformed part."""

from __future__ import annotations

import pytest

from opcore.config import (
    ConfigError,
    OpcoreConfig,
    create_config,
    get_current_config,
    parse_custom_ops,
    parse_ir_op_priority,
    set_current_config,
)
from opcore.platforms import Platform


class RecordingPlatform(Platform):
    """A platform whose hooks record the order they run in and set defaults."""

    name = "recording"
    device_type = "cpu"

    def __init__(self):
        self.calls = []

    def device_count(self):
        return 1

    def get_device_name(self, index=0):
        return "recorder"

    def get_device_total_memory(self, index=0):
        return 1

    def apply_config_platform_defaults(self, config):
        self.calls.append(("defaults", config.kernel.ir_op_priority.copy()))
        config.kernel.ir_op_priority["rms_norm"] = ["platform_default"]
        config.kernel.ir_op_priority["silu_and_mul"] = ["platform_default"]
        config.attention.backend = "PLATFORM_PICK"

    def check_and_update_config(self, config):
        assert isinstance(config, OpcoreConfig)  # always the explicit object
        self.calls.append(("check", config.kernel.ir_op_priority.copy()))


def test_precedence_defaults_platform_env_explicit():
    p = RecordingPlatform()
    env = {"OPCORE_IR_OP_PRIORITY": "rms_norm=from_env", "OPCORE_ATTENTION_BACKEND": "torch_native"}
    cfg = create_config(p, env=env, ir_op_priority={"silu_and_mul": ["explicit"]})
    assert cfg.kernel.ir_op_priority == {"rms_norm": ["from_env"], "silu_and_mul": ["explicit"]}
    assert cfg.attention.backend == "TORCH_NATIVE"  # env beat the platform default
    assert [c[0] for c in p.calls] == ["defaults", "check"]
    # check_and_update_config saw the final values: it has the last word.
    assert p.calls[1][1] == cfg.kernel.ir_op_priority
    cfg = create_config(p, env={}, attention_backend="flash_attn")
    assert cfg.attention.backend == "FLASH_ATTN"
    assert create_config(p, env={}).attention.backend == "PLATFORM_PICK"


def test_parse_ir_op_priority():
    assert parse_ir_op_priority("rms_norm=triton,native;silu_and_mul=native;") == {
        "rms_norm": ["triton", "native"],
        "silu_and_mul": ["native"],
    }


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("rms_norm=triton;silu_and_mul", "'silu_and_mul'"),
        ("rms_norm=triton,Bad-Name", "'Bad-Name'"),
        ("RMS=triton", "'RMS'"),
        ("rms_norm=a;rms_norm=b", "'rms_norm' is given twice"),
        ("rms_norm=triton,,native", "provider ''"),
    ],
)
def test_malformed_priority_quotes_the_bad_part(text, quoted):
    with pytest.raises(ConfigError) as info:
        create_config(RecordingPlatform(), env={"OPCORE_IR_OP_PRIORITY": text})
    assert quoted in str(info.value)
    assert "OPCORE_IR_OP_PRIORITY" in str(info.value)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ("all,none", "more than one base"),
        ("none,+rms_norm,-rms_norm", "+rms_norm and -rms_norm both given"),
        ("none,rms_norm", "'rms_norm' is not 'all', 'none', '+op' or '-op'"),
        ("all,+Bad", "'+Bad'"),
    ],
)
def test_malformed_custom_ops_quotes_the_bad_part(items, message):
    with pytest.raises(ConfigError, match="OPCORE_CUSTOM_OPS") as info:
        create_config(RecordingPlatform(), env={"OPCORE_CUSTOM_OPS": items})
    assert message in str(info.value)


def test_custom_ops_valid_forms():
    assert parse_custom_ops("none,+rms_norm") == ["none", "+rms_norm"]
    assert parse_custom_ops(["-rms_norm"]) == ["-rms_norm"]


def test_mode_and_backend_errors():
    with pytest.raises(ConfigError, match="'jit' is not one of eager, inductor"):
        create_config(RecordingPlatform(), env={"OPCORE_COMPILATION_MODE": "jit"})
    with pytest.raises(ConfigError, match="OPCORE_ATTENTION_BACKEND: 'flash-attn'"):
        create_config(RecordingPlatform(), env={"OPCORE_ATTENTION_BACKEND": "flash-attn"})


def test_set_current_config_is_scoped():
    cfg = create_config(RecordingPlatform(), env={}, mode="inductor")
    before = get_current_config()
    with set_current_config(cfg):
        assert get_current_config() is cfg
    assert get_current_config() is before
