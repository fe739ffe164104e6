"""Provider properties (docs/properties.md): declaration at register_impl, selection by a
config's required properties (decided with the priority, failing loudly at the first
dispatch), the environment switches, the compile cache key and what `opcore info` shows."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from opcore.compile.cache_key import key_material
from opcore.config import ConfigError
from opcore.ir import Properties, info, ops
from opcore.ir.priority import MissingPropertyError, PriorityWarning
from opcore.properties import PROPERTY_NAMES, as_properties
from opcore.settings import create_config, set_current_config
from opcore.testing.ir import temporary_impl, temporary_op


def ir_props_op(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _tagged(tag: float):
    def ir_props_op(x):
        return x * 2 + tag

    return ir_props_op


def _small_only(x):
    return x.numel() <= 4


BI = create_config(required_properties=["batch_invariant"], env={})
PLAIN = create_config(env={})


# --------------------------------------------------------------------------- declaring
def test_properties_forms_and_errors():
    assert as_properties(None, where="w") == Properties()
    assert as_properties({"batch_invariant"}, where="w").names() == {"batch_invariant"}
    assert as_properties({"deterministic": True, "capture_safe": False}, where="w") == Properties(
        deterministic=True
    )
    p = Properties(batch_invariant=True, capture_safe=True)
    assert list(p) == ["batch_invariant", "capture_safe"]
    assert p.missing(["deterministic", "batch_invariant"]) == ["deterministic"]
    with pytest.raises(ValueError, match="unknown property 'batch_invarient'.*did you mean"):
        as_properties(["batch_invarient"], where="op 'x', provider 'y'")
    with pytest.raises(TypeError, match="got the string"):
        as_properties("deterministic", where="w")
    with pytest.raises(TypeError, match="must be True or False"):
        as_properties({"deterministic": 1}, where="w")
    with pytest.raises(TypeError, match="must be a bool"):
        Properties(batch_invariant="yes")  # type: ignore[arg-type]
    with pytest.raises(dataclasses_frozen_error()):
        p.deterministic = True  # type: ignore[misc]


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_register_impl_records_and_refuses_properties():
    with temporary_op(ir_props_op) as op:
        op.register_impl("fast", properties=["deterministic"])(_tagged(1))
        assert op.impls["fast"].properties == Properties(deterministic=True)
        assert op.impls["native"].properties == Properties()
        with pytest.raises(ValueError, match="op 'ir_props_op', provider 'bad': unknown property"):
            op.register_impl("bad", properties={"graph_safe"})
        assert "bad" not in op.impls
        op.declare_native_properties({"batch_invariant", "deterministic"})
        assert op.impls["native"].properties.names() == {"batch_invariant", "deterministic"}


# --------------------------------------------------------------------------- selection
def test_required_property_filters_the_priority():
    with temporary_op(ir_props_op) as op:
        op.register_impl("plain")(_tagged(1))
        op.register_impl("inv", properties={"batch_invariant"})(_tagged(2))
        x = torch.ones(2)
        with op.set_priority(["plain", "inv"]):
            with set_current_config(PLAIN):
                assert op.effective_priority() == ["plain"]
                assert op(x).tolist() == [3.0, 3.0]
            with set_current_config(BI):
                decision = op.decision()
                assert decision.names == ["inv"]
                assert decision.skipped["plain"] == "lacks required property batch_invariant"
                assert op(x).tolist() == [4.0, 4.0]
                assert "lacks property" in str(op.explain(x))


def test_no_provider_with_the_property_fails_at_first_dispatch_naming_them():
    with temporary_op(ir_props_op) as op:
        op.register_impl("plain", properties={"deterministic"})(_tagged(1))
        with set_current_config(BI), pytest.raises(MissingPropertyError) as err:
            op(torch.ones(2))
        text = str(err.value)
        assert "op 'ir_props_op'" in text and "OPCORE_BATCH_INVARIANT" in text
        assert "native (lacks batch_invariant)" in text and "plain (lacks batch_invariant)" in text
        # the same op dispatches normally without the requirement
        with set_current_config(PLAIN):
            assert op(torch.ones(1)).tolist() == [2.0]


def test_chain_cut_short_by_the_requirement_fails_where_no_provider_accepts():
    """native lacks the property, so nothing follows a provider with supports_args: a call
    it declines raises instead of falling back to native."""
    with temporary_op(ir_props_op) as op:
        op.register_impl("inv", supports_args=_small_only, properties={"batch_invariant"})(
            _tagged(5)
        )
        with op.set_priority(["inv"]), set_current_config(BI):
            assert op(torch.ones(2)).tolist() == [7.0, 7.0]
            with pytest.raises(MissingPropertyError, match="do not accept these arguments"):
                op(torch.ones(8))


def test_native_with_the_property_is_the_fallback():
    with temporary_op(ir_props_op) as op:
        op.register_impl("inv", supports_args=_small_only, properties={"batch_invariant"})(
            _tagged(5)
        )
        op.declare_native_properties({"batch_invariant"})
        with op.set_priority(["inv"]), set_current_config(BI):
            with pytest.warns(PriorityWarning, match="'native' was appended as the last resort"):
                assert op.effective_priority() == ["inv", "native"]
            assert op(torch.ones(8)).tolist() == [2.0] * 8


def test_requirement_is_decided_once_not_per_call():
    with temporary_op(ir_props_op) as op:
        op.register_impl("inv", properties={"batch_invariant"})(_tagged(1))
        with op.set_priority(["inv"]), set_current_config(BI):
            op(torch.ones(1))
            cache = op._cache
            for _ in range(5):
                op(torch.ones(1))
            assert op._cache is cache  # no refresh: the decision is cached with the priority
            # one provider taking every argument: dispatch() needs no arguments
            assert cache.route.first is not None


# --------------------------------------------------------------------------- configuration
def test_environment_switches_and_config_field():
    config = create_config(env={"OPCORE_BATCH_INVARIANT": "1", "OPCORE_DETERMINISTIC": "yes"})
    assert config.kernel.required_properties == ["batch_invariant", "deterministic"]
    assert create_config(env={"OPCORE_CAPTURE_SAFE": "on"}).kernel.required_properties == [
        "capture_safe"
    ]
    assert create_config(env={"OPCORE_BATCH_INVARIANT": "0"}).kernel.required_properties == []
    with pytest.raises(ConfigError, match="OPCORE_BATCH_INVARIANT: 'sometimes'"):
        create_config(env={"OPCORE_BATCH_INVARIANT": "sometimes"})
    with pytest.raises(ConfigError, match="unknown property 'bitwise'"):
        create_config(required_properties=["bitwise"], env={})
    explicit = create_config(required_properties=[], env={"OPCORE_BATCH_INVARIANT": "1"})
    assert explicit.kernel.required_properties == []
    assert set(PROPERTY_NAMES) == {"batch_invariant", "deterministic", "capture_safe"}


def test_required_properties_enter_the_compile_cache_key():
    with temporary_op(ir_props_op) as op:
        op.register_impl("det", properties={"deterministic"})(_tagged(1))
        plain = key_material(PLAIN, mode="eager", fusion=False)
        det = create_config(required_properties=["deterministic"], env={})
        required = key_material(det, mode="eager", fusion=False)
        assert plain["required_properties"] == []
        assert required["required_properties"] == ["deterministic"]
        assert plain["ops"]["ir_props_op"]["properties"]["det"] == ["deterministic"]
        assert plain["ops"]["ir_props_op"]["priority"] == ["native"]
        with op.set_priority(["det"]):
            assert key_material(det, mode="eager", fusion=False)["ops"]["ir_props_op"][
                "priority"
            ] == ["det"]
        # an op with no such provider does not stop a key (its calls fail when lowered)
        assert required["ops"]["ir_props_op"]["priority"].startswith("missing properties")
    assert plain["ops"]["rms_norm"]["properties"]["native"] == sorted(
        ops.rms_norm.impls["native"].properties.names()
    )


def test_info_lists_properties_and_the_requirement():
    with temporary_op(ir_props_op) as op:
        op.register_impl("inv", properties={"batch_invariant", "capture_safe"})(_tagged(1))
        with op.set_priority(["inv"]):
            entry = info(BI)["ops"]["ir_props_op"]
        rows = {p["name"]: p["properties"] for p in entry["providers"]}
        assert rows["inv"] == ["batch_invariant", "capture_safe"]
        assert entry["required_properties"] == ["batch_invariant"]
        assert entry["effective_priority"] == ["inv"]


def test_an_op_without_a_provider_of_the_property_is_reported_not_an_error():
    """info and the compile section report the op (no provider of the requirement) without
    failing the others; dispatching it still raises."""
    from opcore.compile.backend import effective_priorities

    with temporary_op(ir_props_op) as op:
        op.register_impl("plain", properties={"deterministic"})(_tagged(1))
        entry = info(BI)["ops"]["ir_props_op"]
        assert "error" not in entry and "effective_priority" not in entry
        assert "op 'ir_props_op'" in entry["missing_properties"]
        assert "plain (lacks batch_invariant)" in entry["missing_properties"]
        priorities = effective_priorities(BI)
        assert priorities["ir_props_op"] == [] and priorities["rms_norm"]
        with set_current_config(BI), pytest.raises(MissingPropertyError):
            op(torch.ones(2))


def test_opcore_info_lists_ops_left_without_a_provider_and_exits_0():
    """On the CPU, native gelu_and_mul is not batch-invariant in float32 (its only
    provider) and native fused_experts is not claimed so: `OPCORE_BATCH_INVARIANT=1 opcore
    info` names them, says a call raises, and exits 0 (the config is valid;
    docs/properties.md). The fp8 ops' and the routers' native functions declare it here,
    so they are not listed."""
    proc = subprocess.run(
        [sys.executable, "-m", "opcore", "info"],
        env={**_plain_env(), "OPCORE_BATCH_INVARIANT": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    listed = [
        line.split()[0]
        for line in proc.stdout.splitlines()
        if "NONE WITH REQUIRED PROPERTIES" in line
    ]
    assert listed == ["fused_experts", "gelu_and_mul"], proc.stdout
    assert "2 op(s) have no provider with the required properties" in proc.stdout
    assert "gelu_and_mul: op 'gelu_and_mul': the config requires batch_invariant" in proc.stdout
    assert "opcore info: error" not in proc.stderr


def _plain_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}


def test_temporary_impl_accepts_properties():
    with temporary_op(ir_props_op) as op:
        with temporary_impl(op, "tmp", _tagged(3), properties={"deterministic"}):
            assert op.impls["tmp"].properties.deterministic


# --------------------------------------------------------------------------- triton variant
def test_triton_batch_invariant_rows_do_not_depend_on_the_batch():
    """The batch-invariant Triton provider under the interpreter (a child: the Triton
    kernel modules are imported in children in this suite): a row alone and the same row
    inside batches of 3 and 40 give the same bits, and the result matches native."""
    code = textwrap.dedent(
        """
        import os
        os.environ["TRITON_INTERPRET"] = "1"
        import torch
        import opcore.kernels.triton
        from opcore.kernels.triton import batch_invariant as bi
        from opcore.ir import ops
        g = torch.Generator().manual_seed(0)
        pool = torch.randn(40, 300, generator=g).to(torch.bfloat16)
        res = torch.randn(40, 300, generator=g).to(torch.bfloat16)
        w = torch.rand(300, generator=g).to(torch.bfloat16) + 0.5
        for name, fn, args in (
            ("rms_norm", bi.rms_norm, lambda rows: (pool[rows], w, 1e-6)),
            ("fused", bi.fused_add_rms_norm, lambda rows: (pool[rows], res[rows], w, 1e-6)),
        ):
            alone = [fn(*args([i])) for i in (0, 7, 39)]
            for batch in ([5, 0, 7], list(range(40))):
                out = fn(*args(batch))
                outs = out if isinstance(out, tuple) else (out,)
                for k, i in enumerate((0, 7, 39)):
                    if i in batch:
                        a = alone[k] if isinstance(alone[k], tuple) else (alone[k],)
                        for o, r in zip(outs, a):
                            assert torch.equal(o[batch.index(i)].view(torch.int16),
                                               r[0].view(torch.int16)), (name, i, batch)
        ref = ops.rms_norm.native(pool, w, 1e-6)
        atol, rtol = ops.rms_norm.tolerance(torch.bfloat16)
        torch.testing.assert_close(bi.rms_norm(pool, w, 1e-6), ref, atol=atol, rtol=rtol)
        assert ops.rms_norm.impls[bi.PROVIDER].properties.batch_invariant
        print("OK")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]


# --------------------------------------------------------------------------- attention
def test_attention_backends_declare_properties_per_variant():
    from opcore.attention.backends.torch_native import TorchNativeBackend
    from opcore.attention.backends.triton_paged import TritonPagedBackend

    assert TorchNativeBackend(8, 128, 2, 0.1).declared_properties() == {
        "batch_invariant",
        "deterministic",
    }
    with set_current_config(PLAIN):
        auto = TritonPagedBackend(8, 128, 2, 0.1)
    assert auto.num_splits is None and "batch_invariant" not in auto.declared_properties()
    # a config requiring batch invariance gets the fixed split count, which has it
    with set_current_config(BI):
        fixed = TritonPagedBackend(8, 128, 2, 0.1)
    assert fixed.num_splits == TritonPagedBackend.batch_invariant_splits
    assert fixed.declared_properties() == {"batch_invariant", "deterministic", "capture_safe"}
    variants = TritonPagedBackend.property_variants()
    assert variants["splits_auto"] == {"num_splits": None}
    assert {"num_splits": TritonPagedBackend.batch_invariant_splits} in variants.values()
