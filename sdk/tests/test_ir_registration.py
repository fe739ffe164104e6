"""Registration rules of opcore.ir: names, signatures, duplicates, supports_args."""

from __future__ import annotations

import pytest
import torch

from opcore.ir import ops, register_op
from opcore.testing.ir import temporary_impl, temporary_op


def _scale(x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
    return x * factor


def test_op_name_defaults_to_function_name_and_registers_torch_op():
    def ir_test_scale(x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
        return x * factor

    with temporary_op(ir_test_scale) as op:
        assert op.name == "ir_test_scale"
        assert ops.ir_test_scale is op
        assert op.torch_op is torch.ops.opcore_ir.ir_test_scale.default
        assert torch.equal(torch.ops.opcore_ir.ir_test_scale(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(AttributeError, match="ir_test_scale"):
        ops.ir_test_scale  # noqa: B018


@pytest.mark.parametrize("name", ["Bad", "1abc", "has-dash", "", "with space"])
def test_malformed_op_name_rejected(name):
    with pytest.raises(ValueError, match="invalid"):
        register_op(name=name)(_scale)


def test_duplicate_op_rejected():
    with pytest.raises(ValueError, match="already registered"):
        register_op(name="rms_norm")(_scale)


def test_native_provider_reserved():
    with pytest.raises(ValueError, match="reserved"):
        ops.silu_and_mul.register_impl("native")


@pytest.mark.parametrize("provider", ["Triton", "9x", "a.b"])
def test_malformed_provider_name_rejected(provider):
    with pytest.raises(ValueError, match="invalid"):
        ops.silu_and_mul.register_impl(provider)


def test_duplicate_provider_rejected_and_unregister_restores():
    def silu_and_mul(x):
        return x

    with temporary_impl(ops.silu_and_mul, "ir_test_dup", silu_and_mul):
        with pytest.raises(ValueError, match="'ir_test_dup' is already registered"):
            ops.silu_and_mul.register_impl("ir_test_dup")(silu_and_mul)
    assert "ir_test_dup" not in ops.silu_and_mul.impls


@pytest.mark.parametrize(
    "fn, what",
    [
        (lambda x, w, epsilon, variance_size=None: x, "w"),  # renamed parameter
        (lambda x, weight, epsilon: x, "missing"),  # missing parameter
        (lambda x, weight, epsilon, variance_size=4: x, "default"),  # other default
        (lambda x, weight, epsilon, variance_size=None, extra=1: x, "extra"),
        (lambda weight, x, epsilon, variance_size=None: x, "order"),
    ],
)
def test_provider_schema_mismatch_names_op_and_provider(fn, what):
    with pytest.raises(ValueError) as info:
        ops.rms_norm.register_impl("ir_test_bad")(fn)
    message = str(info.value)
    assert "'rms_norm'" in message and "'ir_test_bad'" in message
    assert "(x, weight, epsilon, variance_size=None)" in message
    assert "ir_test_bad" not in ops.rms_norm.impls


def test_supports_args_with_wrong_parameters_rejected():
    with pytest.raises(ValueError, match="supports_args of provider 'ir_test_sa'"):
        ops.rms_norm.register_impl("ir_test_sa", supports_args=lambda x, weight: True)


def test_supports_args_must_return_plain_bool():
    def rms_norm(x, weight, epsilon, variance_size=None):
        return x

    x = torch.ones(2, 4)
    with temporary_impl(
        ops.rms_norm,
        "ir_test_truthy",
        rms_norm,
        supports_args=lambda x, weight, epsilon, variance_size=None: torch.tensor(True),
    ):
        with ops.rms_norm.set_priority(["ir_test_truthy", "native"]):
            with pytest.raises(TypeError, match="plain bool"):
                ops.rms_norm.dispatch(x, None, 1e-6)


def test_inplace_provider_needs_allow_inplace():
    with pytest.raises(ValueError, match="allow_inplace"):
        ops.rms_norm.register_impl("ir_test_inplace", inplace=True)


def test_supported_must_be_bool():
    with pytest.raises(TypeError, match="supported must be a bool"):
        ops.rms_norm.register_impl("ir_test_sup", supported=1)


def test_native_function_needs_annotations():
    def ir_test_noann(x, factor=2.0) -> torch.Tensor:
        return x

    with pytest.raises(TypeError, match="annotate"):
        register_op(ir_test_noann)


def test_keyword_only_parameters_rejected():
    def ir_test_kwonly(x: torch.Tensor, *, factor: float = 1.0) -> torch.Tensor:
        return x

    with pytest.raises(ValueError, match="keyword"):
        register_op(ir_test_kwonly)


def test_impls_hold_impl_records():
    impl = ops.rms_norm.impls["native"]
    assert impl.provider == "native" and impl.supported and impl.supports_args is None
    assert impl.inplace is False and impl.impl_fn is ops.rms_norm.native


def test_identity_hash_is_stable_and_differs_per_provider():
    def silu_and_mul(x):
        return x

    first = ops.silu_and_mul.identity_hash("native")
    assert first == ops.silu_and_mul.identity_hash("native") and len(first) == 64
    with temporary_impl(ops.silu_and_mul, "ir_test_hash", silu_and_mul):
        assert ops.silu_and_mul.identity_hash("ir_test_hash") != first
    with pytest.raises(KeyError, match="ir_test_hash"):
        ops.silu_and_mul.identity_hash("ir_test_hash")


def test_identity_sources_enter_the_identity_hash(tmp_path, monkeypatch):
    # A launch helper outside the provider's own file decides what it computes: editing
    # it must change the identity (tuning tables and compile caches are keyed on it).
    import importlib

    helper = tmp_path / "ir_test_launch_helper.py"
    helper.write_text("BLOCK = 128\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("ir_test_launch_helper")

    def silu_and_mul(x):
        return x

    def identity(**options):
        with temporary_impl(ops.silu_and_mul, "ir_test_src", silu_and_mul, **options):
            return ops.silu_and_mul.identity_hash("ir_test_src")

    plain = identity()
    before = identity(identity_sources=[module])
    helper.write_text("BLOCK = 256\n")
    after = identity(identity_sources=[module])
    assert len({plain, before, after}) == 3
    with pytest.raises(TypeError, match="identity_sources takes modules or functions"):
        identity(identity_sources=["ir_test_launch_helper"])


def test_tolerance_defaults_and_overrides():
    assert ops.silu_and_mul.tolerance(torch.float32) == (1e-5, 1.3e-6)
    assert ops.rms_norm.tolerance(torch.float16) == (1e-2, 2e-3)  # per-op override
    with pytest.raises(ValueError, match="no default tolerance"):
        ops.silu_and_mul.tolerance(torch.int8)

    def ir_test_tol(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    with temporary_op(ir_test_tol) as op:
        op.override_tolerance(torch.bfloat16, atol=0.5, rtol=0.25)
        assert op.tolerance(torch.bfloat16) == (0.5, 0.25)
