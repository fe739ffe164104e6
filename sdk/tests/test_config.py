"""OpcoreConfig: precedence, hook order, and errors that quote the malformed part."""

from __future__ import annotations

import pytest

import opcore.layers  # noqa: F401  (the registry custom_ops names are checked against)
from opcore.attention.registry import register_backend
from opcore.config import (
    SWITCH_VARIABLES,
    ConfigError,
    OpcoreConfig,
    env_flag,
    parse_custom_ops,
    parse_ir_op_priority,
)
from opcore.platforms import Platform
from opcore.plugins import PLATFORM_PLUGINS_GROUP
from opcore.settings import create_config, get_current_config, set_current_config
from opcore.testing import make_distribution, run_python
from opcore.testing.attention import unregister_backend


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
    cfg = create_config(p, env={}, attention_backend="triton_paged")
    assert cfg.attention.backend == "TRITON_PAGED"
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


# ----------------------------------------------------------------------- every OPCORE_* variable
@pytest.mark.parametrize("variable", SWITCH_VARIABLES)
def test_switches_are_checked_when_the_config_is_created(variable):
    for good in ("1", "true", "YES", " on ", "0", "false", "No", "off", ""):
        create_config(RecordingPlatform(), env={variable: good})
    with pytest.raises(ConfigError) as err:
        create_config(RecordingPlatform(), env={variable: "maybe"})
    message = str(err.value)
    assert message.startswith(f"{variable}: 'maybe' is not a switch value")
    assert "1, true, yes, on" in message and "0, false, no, off" in message
    assert "\n" not in message
    assert env_flag(variable, {variable: "On"}) and not env_flag(variable, {})


@pytest.mark.parametrize("value", [",", "cpu,", "cpu,,acme", " "])
def test_plugin_allow_list_with_an_empty_name_is_refused(value):
    with pytest.raises(ConfigError) as err:
        create_config(RecordingPlatform(), env={"OPCORE_PLUGINS": value})
    assert str(err.value).startswith(f"OPCORE_PLUGINS: {value!r} has an empty name")
    create_config(RecordingPlatform(), env={"OPCORE_PLUGINS": "cpu, acme"})


def test_custom_ops_names_must_be_registered_layer_ops():
    with pytest.raises(ConfigError) as err:
        create_config(RecordingPlatform(), env={"OPCORE_CUSTOM_OPS": "all,+rms_nrom"})
    message = str(err.value)
    assert message.startswith(
        "OPCORE_CUSTOM_OPS: '+rms_nrom' names no known layer op (did you mean 'rms_norm'?)"
    )
    assert "rms_norm" in message.split("known: ")[1].split(", ")
    with pytest.raises(ConfigError) as err:
        create_config(RecordingPlatform(), env={}, custom_ops=["-silu_and_mull"])
    assert "custom_ops: '-silu_and_mull'" in str(err.value) and "'silu_and_mul'" in str(err.value)
    # `attention` is a PluggableLayer: custom_ops does not apply to it.
    with pytest.raises(ConfigError, match="'-attention' names no known layer op"):
        create_config(RecordingPlatform(), env={"OPCORE_CUSTOM_OPS": "-attention"})
    cfg = create_config(RecordingPlatform(), env={"OPCORE_CUSTOM_OPS": "none,+rms_norm"})
    assert cfg.compilation.custom_ops == ["none", "+rms_norm"]


def test_attention_backend_names_must_be_known():
    with pytest.raises(ConfigError) as err:
        create_config(RecordingPlatform(), env={"OPCORE_ATTENTION_BACKEND": "torch_natve"})
    assert str(err.value).startswith(
        "OPCORE_ATTENTION_BACKEND: 'torch_natve' names no known attention backend "
        "(did you mean 'TORCH_NATIVE'?)"
    )
    with pytest.raises(ConfigError, match="attention.backend: 'nosuch' names no known"):
        create_config(RecordingPlatform(), env={}, attention_backend="nosuch")
    # A name a plugin registered is known from then on.
    register_backend("CONFIG_TEST_ATTN", "config_test.Backend")
    try:
        cfg = create_config(
            RecordingPlatform(), env={"OPCORE_ATTENTION_BACKEND": "config_test_attn"}
        )
        assert cfg.attention.backend == "CONFIG_TEST_ATTN"
    finally:
        unregister_backend("CONFIG_TEST_ATTN")


def test_names_a_platform_registers_in_import_kernels_are_known(tmp_path):
    """A brand-new attention backend and layer op registered by the platform's
    `import_kernels` (which runs lazily) are accepted: config creation loads the kernels
    before it calls a name unknown, also when the plugin asks for the config meanwhile
    (that used to hang on the config lock)."""
    make_distribution(
        tmp_path,
        "opcore-plugin-zeta",
        entry_points={PLATFORM_PLUGINS_GROUP: {"zeta": "zeta_plugin:probe"}},
        files={
            "zeta_plugin.py": """
                from opcore_plugin_cpu.platform import CpuPlatform

                def probe():
                    return "zeta_plugin.Zeta"

                class Zeta(CpuPlatform):
                    name = "zeta"

                    def import_kernels(self):
                        super().import_kernels()
                        from opcore.attention.registry import register_backend
                        from opcore.settings import get_current_config
                        from opcore.layers import CustomOp

                        # Asking for the config while the check loads the kernels must
                        # neither hang nor refuse the names registered below.
                        get_current_config()

                        register_backend("ZETA_ATTN", "zeta_plugin.ZetaAttention")

                        @CustomOp.register("zeta_op")
                        class ZetaOp(CustomOp):
                            def forward_native(self, x):
                                return x
            """
        },
    )
    code = """
        import opcore.attention, opcore.layers  # the registries the names are checked against
        from opcore.settings import get_current_config
        c = get_current_config()
        print(c.attention.backend, c.compilation.custom_ops)
    """
    env = {"OPCORE_ATTENTION_BACKEND": "zeta_attn", "OPCORE_CUSTOM_OPS": "none,+zeta_op"}
    proc = run_python(code, site=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2] == "ZETA_ATTN ['none', '+zeta_op']"
    # Without the plugin the same names are refused, one line naming the variable.
    proc = run_python(code, env={"OPCORE_CUSTOM_OPS": "none,+zeta_op"}, timeout=120)
    assert proc.returncode != 0
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "opcore.config.ConfigError: OPCORE_CUSTOM_OPS: '+zeta_op' names no known layer op"
        )
    )


def test_probe_budget_is_checked_when_the_config_is_created(monkeypatch):
    monkeypatch.setenv("OPCORE_PROBE_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="OPCORE_PROBE_TIMEOUT_S='soon': expected a positive"):
        create_config(RecordingPlatform())


def test_names_are_checked_when_their_registry_first_serves_the_config():
    """opcore.settings sits below the layers and attention (it imports neither): a config
    built before a registry is loaded has that registry's names checked when the registry
    first serves it, with the message naming what set them; one built after is checked at
    once."""
    code = """
        import sys
        from opcore.config import ConfigError
        from opcore.settings import create_config, get_current_config, set_current_config

        c = get_current_config()  # neither registry is loaded: nothing to check against yet
        explicit = create_config(env={}, attention_backend="torch_natve")
        print("built", "opcore.layers" in sys.modules, "opcore.attention" in sys.modules)
        from opcore.layers import RMSNorm
        for _ in range(2):  # still refused the second time: the name stays unchecked
            try:
                RMSNorm(8)
            except ConfigError as exc:
                print("layer", exc)
        import torch
        from opcore.attention import AttentionSelectorConfig, select_backend

        cfg = AttentionSelectorConfig(
            head_size=64, num_heads=8, num_kv_heads=8, dtype=torch.float32
        )
        try:
            select_backend(cfg, config=explicit)
        except ConfigError as exc:
            print("attention", exc)
        try:
            create_config(env={"OPCORE_CUSTOM_OPS": "+rms_nrom"})  # layers loaded: at once
        except ConfigError as exc:
            print("at once", exc)
        good = create_config(env={}, custom_ops=["none", "+rms_norm"])
        with set_current_config(good):
            print("good", RMSNorm(8).bound_method)
    """
    proc = run_python(code, env={"OPCORE_CUSTOM_OPS": "none,+rms_nrom"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "built False False" in lines
    refused = [line for line in lines if line.startswith("layer ")]
    assert len(refused) == 2 and all(
        line.startswith(
            "layer OPCORE_CUSTOM_OPS: '+rms_nrom' names no known layer op "
            "(did you mean 'rms_norm'?)"
        )
        for line in refused
    ), lines
    assert any(
        line.startswith(
            "attention attention.backend: 'torch_natve' names no known attention backend "
            "(did you mean 'TORCH_NATIVE'?)"
        )
        for line in lines
    ), lines
    assert any(
        line.startswith("at once OPCORE_CUSTOM_OPS: '+rms_nrom' names no known layer op")
        for line in lines
    ), lines
    assert "good forward_native" in lines
