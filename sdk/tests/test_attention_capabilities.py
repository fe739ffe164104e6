"""Capability declarations -> `validate_configuration` reasons, and config argument checks."""

from __future__ import annotations

import pytest
import torch

from opcore.attention import AttentionBackend, AttentionSelectorConfig, MultipleOf
from opcore.attention.backends.torch_native import TorchNativeBackend
from opcore.attention.backends.triton_paged import TritonPagedBackend


def cfg(**kw) -> AttentionSelectorConfig:
    base = dict(head_size=128, num_heads=32, num_kv_heads=8, dtype=torch.float16, block_size=16)
    base.update(kw)
    return AttentionSelectorConfig(**base)


class PickyBackend(AttentionBackend):
    """Declares narrow capabilities so every reason can be provoked."""

    name = "PICKY"
    supported_dtypes = (torch.bfloat16,)
    supported_kv_cache_dtypes = ("auto", "fp8_e4m3")
    supported_head_sizes = (64, 128)
    supported_block_sizes = (MultipleOf(32), 48)
    supported_device_types = ("cuda",)


def test_defaults_are_conservative():
    assert AttentionBackend.validate_configuration(cfg()) == [
        "grouped-query attention (num_heads 32, num_kv_heads 8) not supported"
    ]
    assert AttentionBackend.validate_configuration(cfg(num_kv_heads=32)) == []


def test_each_declaration_gives_its_own_reason():
    reasons = PickyBackend.validate_configuration(
        cfg(
            dtype=torch.float16,
            kv_cache_dtype="fp8_e5m2",
            head_size=96,
            block_size=16,
            num_kv_heads=1,
            sliding_window=128,
            causal=False,
            logits_soft_cap=30.0,
            device_type="cpu",
        )
    )
    assert reasons == [
        "device type 'cpu' not supported (supported: cuda)",
        "dtype float16 not supported (supported: bfloat16)",
        "kv_cache_dtype 'fp8_e5m2' not supported (supported: auto, fp8_e4m3)",
        "head_size 96 not supported (supported: 64, 128)",
        "block_size 16 not supported (supported: multiples of 32, 48)",
        "multi-query attention (num_heads 32, 1 kv head) not supported",
        "sliding window not supported",
        "non-causal attention not supported",
        "logits soft-cap not supported",
    ]


@pytest.mark.parametrize(
    "block_size, ok", [(32, True), (96, True), (48, True), (64, True), (16, False), (40, False)]
)
def test_block_sizes_exact_or_multiple(block_size, ok):
    reasons = PickyBackend.validate_configuration(
        cfg(dtype=torch.bfloat16, num_kv_heads=32, block_size=block_size, device_type="cuda")
    )
    assert (reasons == []) is ok, reasons


def test_kv_cache_dtype_auto_matches_own_dtype_by_name():
    # "auto" support covers a config that spells its own dtype out, not another one.
    assert TorchNativeBackend.validate_configuration(cfg(kv_cache_dtype="float16")) == []
    assert TorchNativeBackend.validate_configuration(cfg(kv_cache_dtype="bfloat16")) == [
        "kv_cache_dtype 'bfloat16' not supported (supported: auto)"
    ]


def test_unavailable_reason_and_combination_veto_are_reported():
    class Vetoing(TorchNativeBackend):
        @classmethod
        def unavailable_reason(cls, device_type):
            return "libfoo is not installed"

        @classmethod
        def supports_combination(cls, c):
            return "head_size 128 with a window is not supported" if c.sliding_window else None

    assert Vetoing.validate_configuration(cfg(sliding_window=64)) == [
        "libfoo is not installed",
        "head_size 128 with a window is not supported",
    ]


def test_sdk_backends_declarations():
    assert (
        TorchNativeBackend.validate_configuration(
            cfg(
                dtype=torch.float64,
                num_kv_heads=1,
                sliding_window=8,
                causal=False,
                logits_soft_cap=5.0,
                block_size=7,
            )
        )
        == []
    )
    reasons = TritonPagedBackend.validate_configuration(
        cfg(dtype=torch.float32, head_size=48, kv_cache_dtype="fp8_e4m3", device_type="tpu")
    )
    assert "dtype float32 not supported (supported: float16, bfloat16)" in reasons
    assert any(r.startswith("head_size 48 not supported") for r in reasons)
    assert "kv_cache_dtype 'fp8_e4m3' not supported (supported: auto)" in reasons
    assert "device type 'tpu' not supported (supported: cuda, xpu)" in reasons
    assert (
        TritonPagedBackend.validate_configuration(cfg(device_type="cuda", sliding_window=4096))
        == []
    )


def test_triton_backend_rejects_the_cpu_unless_interpreting(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert TritonPagedBackend.validate_configuration(cfg(device_type="cpu")) == [
        "device type 'cpu' not supported (supported: cuda, xpu)"
    ]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert TritonPagedBackend.validate_configuration(cfg(device_type="cpu")) == []


def test_capabilities_as_data():
    caps = TritonPagedBackend.capabilities()
    assert caps["dtypes"] == ["float16", "bfloat16"]
    assert caps["block_sizes"] == ["any size"]
    assert caps["sliding_window"] is True


@pytest.mark.parametrize(
    "kw, field",
    [
        (
            dict(num_heads=32, num_kv_heads=6),
            "num_heads (32) must be a multiple of num_kv_heads (6)",
        ),
        (dict(head_size=0), "head_size"),
        (dict(num_kv_heads=-1), "num_kv_heads"),
        (dict(block_size=0), "block_size"),
        (dict(sliding_window=0), "sliding_window"),
        (dict(logits_soft_cap=-1.0), "logits_soft_cap"),
        (dict(dtype="float16"), "dtype"),
    ],
)
def test_config_rejects_bad_arguments_by_name(kw, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
        cfg(**kw)


def test_backend_instance_rejects_mismatched_head_counts():
    with pytest.raises(
        ValueError, match=r"num_heads \(12\) must be a multiple of num_kv_heads \(8\)"
    ):
        TorchNativeBackend(12, 64, 8, 0.125)
