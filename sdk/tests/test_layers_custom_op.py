"""CustomOp binding (forward_native, or a register_oot replacement's forward_oot, under the
custom_ops rules), register_oot keyed by op name, PluggableLayer, binding_info and routes."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from opcore.config import ConfigError
from opcore.layers import CustomOp, PluggableLayer, RMSNorm, binding_info
from opcore.settings import create_config, set_current_config


@contextlib.contextmanager
def custom_ops(items, mode="eager"):
    with set_current_config(create_config(custom_ops=items, mode=mode)) as config:
        yield config


@pytest.fixture
def layer_cls():
    """A registered layer whose register_oot replacement defines forward_oot; yields the
    in-tree class (constructing it builds the replacement)."""

    @CustomOp.register("layers_test_op")
    class LayersTestOp(CustomOp):
        def forward_native(self, x):
            return "native"

    class LayersTestOpOot(LayersTestOp):
        def forward_oot(self, x):
            return "oot"

    LayersTestOp.register_oot(LayersTestOpOot)
    yield LayersTestOp
    CustomOp.unregister("layers_test_op")


TRUTH_TABLE = [
    ([], "eager", True),
    ([], "inductor", False),
    (["all"], "eager", True),
    (["all"], "inductor", True),
    (["none"], "eager", False),
    (["none", "+layers_test_op"], "eager", True),
    (["+layers_test_op"], "inductor", True),
    (["all", "-layers_test_op"], "eager", False),
    (["-layers_test_op"], "eager", False),
    (["none", "-layers_test_op"], "eager", False),
    (["all", "+layers_test_op"], "inductor", True),
    # another op's rule leaves this one to the base (names must be registered layer ops)
    (["none", "+rms_norm"], "eager", False),
    (["all", "-rms_norm"], "inductor", True),
]


@pytest.mark.parametrize("items, mode, enabled", TRUTH_TABLE)
def test_custom_ops_truth_table(layer_cls, items, mode, enabled):
    with custom_ops(items, mode):
        layer = layer_cls()
    assert type(layer).__name__ == "LayersTestOpOot"  # replaced whether enabled or not
    assert layer.bound_method == ("forward_oot" if enabled else "forward_native")
    assert layer(torch.ones(1)) == ("oot" if enabled else "native")
    record = binding_info()["bindings"][f"{layer_cls.__module__}.{type(layer).__qualname__}"]
    assert record["enabled"] is enabled and record["method"] == layer.bound_method


@pytest.mark.parametrize("items", [["+layers_test_op", "-layers_test_op"], ["all", "none"]])
def test_conflicting_custom_ops_are_errors(layer_cls, items):
    with pytest.raises(ConfigError):
        create_config(custom_ops=items)
    config = create_config()
    config.compilation.custom_ops = items  # bypassing the parser still fails at binding
    with set_current_config(config), pytest.raises(ValueError, match="custom_ops"):
        layer_cls()


def test_env_custom_ops(layer_cls):
    config = create_config(env={"OPCORE_CUSTOM_OPS": "none,+layers_test_op"})
    with set_current_config(config):
        assert layer_cls().bound_method == "forward_oot"
    with set_current_config(create_config(env={"OPCORE_CUSTOM_OPS": "all,-layers_test_op"})):
        assert layer_cls().bound_method == "forward_native"


def test_enforce_enable(layer_cls):
    with custom_ops(["none"]):
        assert layer_cls(enforce_enable=True).bound_method == "forward_oot"


@pytest.mark.parametrize("method", ["forward_acme", "forward_gpu"])
def test_vendor_forward_method_is_refused_at_class_creation(method):
    # Plugin API 1.x picked forward_<vendor> methods by a platform chain; 2.0 never calls
    # them, so a class that still has one must not lose its kernel in silence.
    body = {"forward_native": lambda self, x: "native", method: lambda self, x: "vendor"}
    with pytest.raises(TypeError) as info:
        type("LegacyLayer", (CustomOp,), body)
    message = str(info.value)
    assert f"defines {method}:" in message and "opcore.ir provider" in message
    assert "docs/design.md#plugin-api-2-0" in message


def test_static_forward_helpers_are_allowed():
    class WithHelper(CustomOp):
        @staticmethod
        def forward_static(x):
            return x + 1

        def forward_native(self, x):
            return self.forward_static(x)

    assert WithHelper()(1) == 2


def test_forward_oot_outside_a_replacement_is_ignored_and_said(caplog):
    @CustomOp.register("layers_test_unregistered_oot")
    class InTree(CustomOp):
        def forward_native(self, x):
            return "native"

        def forward_oot(self, x):
            return "oot"

    try:
        with caplog.at_level(logging.WARNING, logger="opcore.layers"):
            layer = InTree()
        assert layer.bound_method == "forward_native" and layer(None) == "native"
        assert any("not a register_oot replacement" in r.getMessage() for r in caplog.records)
        why = binding_info()["registry"]["layers_test_unregistered_oot"]["why"]
        assert "forward_oot ignored" in why
    finally:
        CustomOp.unregister("layers_test_unregistered_oot")


def test_reference_layer_route_names_its_ops():
    RMSNorm(8)
    entry = binding_info()["registry"]["rms_norm"]
    assert entry["bound"] == "forward_native" and entry["replacement"] is None
    assert entry["route"] == (
        "forward_native -> op rms_norm, fused_add_rms_norm (priority picks the kernel)"
    )


def test_duplicate_layer_name_rejected(layer_cls):
    with pytest.raises(ValueError, match="already registered"):

        @CustomOp.register("layers_test_op")
        class Other(CustomOp):
            pass


class VendorRMSNorm(RMSNorm):
    def forward_oot(self, x, residual=None):
        return ("vendor", x)


@pytest.fixture
def vendor_rms_norm():
    RMSNorm.register_oot(VendorRMSNorm)
    yield VendorRMSNorm
    RMSNorm.unregister_oot()


def test_register_oot_replacement_reached(vendor_rms_norm):
    layer = RMSNorm(8, eps=1e-5)
    assert type(layer) is VendorRMSNorm and layer.variance_epsilon == 1e-5  # __init__ ran
    assert layer.bound_method == "forward_oot" and layer(torch.ones(8))[0] == "vendor"
    info = binding_info()
    assert info["registry"]["rms_norm"]["replacement"].endswith("VendorRMSNorm")
    assert info["registry"]["rms_norm"]["route"] == (
        "register_oot: VendorRMSNorm (whole-layer replacement), forward_oot"
    )
    record = info["bindings"][f"{VendorRMSNorm.__module__}.VendorRMSNorm"]
    assert record["replaces"] == "opcore.layers.norm.RMSNorm" and record["op"] == "rms_norm"
    assert record["route"] == info["registry"]["rms_norm"]["route"]


def test_register_oot_still_switched_off_by_minus_op_name(vendor_rms_norm):
    with custom_ops(["all", "-rms_norm"]):
        layer = RMSNorm(8)
    assert type(layer) is VendorRMSNorm and layer.bound_method == "forward_native"
    assert binding_info()["bindings"][f"{VendorRMSNorm.__module__}.VendorRMSNorm"]["route"] == (
        "register_oot: VendorRMSNorm (whole-layer replacement), "
        "forward_native -> op rms_norm, fused_add_rms_norm (priority picks the kernel)"
    )
    x = torch.randn(2, 8)
    torch.testing.assert_close(layer(x), RMSNorm.forward_native(layer, x))


def test_register_oot_by_name_and_idempotence():
    decorator = CustomOp.register_oot(name="rms_norm")
    assert decorator(VendorRMSNorm) is VendorRMSNorm
    try:
        CustomOp.register_oot(VendorRMSNorm, name="rms_norm")  # same class again: no-op
        assert type(RMSNorm(4)) is VendorRMSNorm

        class Another(RMSNorm):
            pass

        with pytest.raises(ValueError, match="already has the replacement"):
            RMSNorm.register_oot(Another)
    finally:
        RMSNorm.unregister_oot()
    assert type(RMSNorm(4)) is RMSNorm


def test_register_oot_errors():
    class NotASubclass(CustomOp):
        pass

    with pytest.raises(TypeError, match="must subclass"):
        RMSNorm.register_oot(NotASubclass)
    with pytest.raises(KeyError, match="no layer registered as 'no_such_layer'"):
        CustomOp.register_oot(NotASubclass, name="no_such_layer")
    with pytest.raises(TypeError, match="needs name="):
        CustomOp.register_oot(NotASubclass)


def test_subclass_of_registered_layer_is_not_replaced(vendor_rms_norm):
    class MyNorm(RMSNorm):
        pass

    assert type(MyNorm(4)) is MyNorm


def test_binding_is_logged(layer_cls, caplog):
    with caplog.at_level(logging.DEBUG, logger="opcore.layers"):
        layer_cls()
    assert any(
        "layers_test_op" in r.getMessage() and "forward_oot" in r.getMessage()
        for r in caplog.records
    )


def test_pluggable_layer_replacement():
    @PluggableLayer.register("layers_test_attention")
    class Attn(PluggableLayer):
        def __init__(self, heads):
            super().__init__()
            self.heads = heads

        def forward(self, x):
            return "in-tree"

    class VendorAttn(Attn):
        def forward(self, x):
            return "vendor"

    try:
        assert Attn(2)(None) == "in-tree"
        Attn.register_oot(VendorAttn)
        layer = Attn(4)
        assert type(layer) is VendorAttn and layer.heads == 4 and layer(None) == "vendor"
        with custom_ops(["none"]):  # custom_ops does not apply to whole-module replacement
            assert type(Attn(4)) is VendorAttn
        info = binding_info()
        record = info["bindings"][f"{VendorAttn.__module__}.{VendorAttn.__qualname__}"]
        assert record["replaces"].endswith("Attn")
        assert record["route"].startswith("register_oot: ")
        assert "VendorAttn (whole-layer replacement), forward" in record["route"]
        assert info["registry"]["layers_test_attention"]["route"] == record["route"]
    finally:
        PluggableLayer.unregister("layers_test_attention")
