"""opcore.compile: lowering picks the provider eager dispatch picks, per compile mode;
opaque lowering of untraceable providers; records; the cache key; recompilation when the
priority changes; no recompilation across dynamic batch sizes; Inductor end to end."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

import opcore.compile as oc
from opcore.compile import testing as ct
from opcore.config import OpcoreConfig
from opcore.ir import ops
from opcore.testing.ir import temporary_impl


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _doubled_rms(x, weight, epsilon, variance_size=None):
    # a provider built on torch ops (traceable), distinguishable from native by its result
    return ops.rms_norm.native(x, weight, epsilon, variance_size) * 2


def _wide_only(x, weight, epsilon, variance_size=None):
    return x.shape[-1] >= 32


@pytest.fixture
def test_provider():
    with (
        temporary_impl(ops.rms_norm, "test_wide", _doubled_rms, supports_args=_wide_only),
        ops.rms_norm.set_priority(["test_wide", "native"]),
    ):
        yield


def test_lowering_picks_what_eager_dispatch_picks(test_provider):
    f = lambda x, w: ops.rms_norm(x, w, 1e-6)  # noqa: E731
    for width, provider in ((64, "test_wide"), (16, "native")):
        torch._dynamo.reset()
        x, w = torch.randn(3, width), torch.randn(width)
        assert ops.rms_norm.dispatch(x, w, 1e-6).provider == provider
        be = oc.backend(mode="eager")
        with torch.no_grad():
            got = torch.compile(f, backend=be, fullgraph=True)(x, w)
        torch.testing.assert_close(got, f(x, w))
        decision = be.last_record.lowered[0]
        assert (decision.op, decision.provider, decision.how) == ("rms_norm", provider, "traced")
        assert decision.priority == ["test_wide", "native"]
        assert oc.last_lowering_record() is be.last_record
        assert ct.lowering_matches_dispatch("rms_norm", _sample(x, w)) == {"provider": provider}


def _sample(*args):
    from opcore.ir.samples import SampleInput

    return SampleInput("t", (*args, 1e-6))


def test_compile_mode_reaches_the_platform_default_priority(monkeypatch):
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    seen = []

    def by_mode(config):
        seen.append(config.compilation.mode)
        return {"rms_norm": ["test_wide", "native"]} if config.compilation.mode == "eager" else {}

    monkeypatch.setattr(platform, "get_default_ir_op_priority", by_mode)
    x, w = torch.randn(2, 64), torch.randn(64)
    with temporary_impl(ops.rms_norm, "test_wide", _doubled_rms, supports_args=_wide_only):
        ops.rms_norm.effective_priority()  # (cache refresh under the current config)
        for mode, provider in (("eager", "test_wide"), ("inductor", "native")):
            assert ct.lowering_matches_dispatch("rms_norm", _sample(x, w), mode=mode) == {
                "provider": provider
            }
        assert oc.info()["modes"]["eager"]["priorities"]["rms_norm"] == ["test_wide", "native"]
        assert oc.info()["modes"]["inductor"]["priorities"]["rms_norm"] == ["native"]
    assert {"eager", "inductor"} <= set(seen)


def test_untraceable_provider_is_lowered_as_an_opaque_call():
    calls = []

    def untraceable(x, weight, epsilon, variance_size=None):
        calls.append(1)
        x.data_ptr()  # what a raw kernel launch does: impossible on fake tensors
        return ops.rms_norm.native(x, weight, epsilon, variance_size) + 1

    x, w = torch.randn(3, 8), torch.randn(8)
    with (
        temporary_impl(ops.rms_norm, "test_raw", untraceable),
        ops.rms_norm.set_priority(["test_raw"]),
    ):
        be = oc.backend(mode="eager")
        with torch.no_grad():
            got = torch.compile(lambda a, b: ops.rms_norm(a, b, 1e-6), backend=be, fullgraph=True)(
                x, w
            )
        decision = be.last_record.lowered[0]
        assert decision.how == "opaque" and decision.provider == "test_raw"
        assert "data pointer" in decision.trace_error
        torch.testing.assert_close(got, ops.rms_norm.native(x, w, 1e-6) + 1)
        assert calls  # the provider really ran


def test_cache_key_covers_priority_and_provider_source(tmp_path, monkeypatch):
    config = OpcoreConfig()
    base = oc.cache_key(config, mode="eager")
    assert oc.cache_key(config, mode="eager") == base
    assert oc.cache_key(config, mode="inductor") != base
    assert oc.cache_key(config, mode="eager", fusion=False) != base
    with temporary_impl(ops.rms_norm, "test_wide", _doubled_rms, supports_args=_wide_only):
        registered = oc.cache_key(config, mode="eager")
        assert registered != base  # a new provider's identity is part of the key
        with ops.rms_norm.set_priority(["test_wide", "native"]):
            assert oc.cache_key(config, mode="eager") != registered
        config.kernel.ir_op_priority["rms_norm"] = ["test_wide", "native"]
        assert oc.cache_key(config, mode="eager") != registered
    # the same provider name with a changed source file
    monkeypatch.syspath_prepend(str(tmp_path))
    keys = []
    for version in (1, 2):
        (tmp_path / f"opcore_test_kernel_v{version}.py").write_text(
            textwrap.dedent(f"""
            from opcore.ir import ops

            def kernel(x, weight, epsilon, variance_size=None):
                return ops.rms_norm.native(x, weight, epsilon, variance_size) * {version}
        """)
        )
        module = __import__(f"opcore_test_kernel_v{version}")
        with temporary_impl(ops.rms_norm, "test_src", module.kernel):
            keys.append(oc.cache_key(OpcoreConfig(), mode="eager"))
        del sys.modules[module.__name__]
    assert keys[0] != keys[1]


def test_changing_the_priority_recompiles(test_provider):
    x, w = torch.randn(3, 64), torch.randn(64)
    be = oc.backend(mode="eager")
    compiled = torch.compile(lambda a, b: ops.rms_norm(a, b, 1e-6), backend=be, fullgraph=True)
    with torch.no_grad():
        first = compiled(x, w)
        assert be.last_record.by_op() == {"rms_norm": ["test_wide"]}
        with ops.rms_norm.set_priority(["native"]):
            second = compiled(x, w)
            assert len(be.records) == 2 and be.last_record.by_op() == {"rms_norm": ["native"]}
        third = compiled(x, w)  # back to the first priority: the first variant, not a stale graph
    assert len(be.records) == 2  # kept per cache key: not compiled a third time
    torch.testing.assert_close(first, 2 * second)
    torch.testing.assert_close(third, first)


def test_dynamic_batch_sizes_do_not_recompile():
    def f(x, r, w):
        a, b = ops.fused_add_rms_norm(x, r, w, 1e-6)
        return ops.rms_norm(a * b, w, 1e-6)

    be = oc.backend(mode="eager")
    compiled = torch.compile(f, backend=be)
    w = torch.randn(16)
    with torch.no_grad():
        for t in (2, 5, 9):
            x, r = torch.randn(t, 16), torch.randn(t, 16)
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(r, 0)
            torch.testing.assert_close(compiled(x, r, w), f(x, r, w))
    assert len(be.records) == 1


def test_inductor_mode_end_to_end_and_record_on_cache_hit():
    def f(x, res, w):
        s = x * 3 + res
        return ops.rms_norm(s, w, 1e-5) + 1, s

    x, res, w = torch.randn(4, 32), torch.randn(4, 32), torch.randn(32)
    want = f(x, res, w)
    for attempt in range(2):  # the second compile may be served by Inductor's cache
        torch._dynamo.reset()
        be = oc.backend(mode="inductor")
        with torch.no_grad():
            got = torch.compile(f, backend=be, fullgraph=True)(x, res, w)
        torch.testing.assert_close(got, want)
        record = be.last_record
        assert record.mode == "inductor" and record.fusions == {"fuse_add_rms_norm": 1}, (
            attempt,
            record,
        )
        assert record.by_op() == {"fused_add_rms_norm": ["native"]}
    if torch._inductor.config.fx_graph_cache:
        assert record.cache_hit  # same cache key, same graph: Inductor did not compile it again


def test_info_is_plain_data():
    data = oc.info()
    json.dumps(data)
    assert data["pipeline"][0].startswith("functionalize_inplace") and data["pipeline"][-2:] == [
        "lower",
        "clone_elimination",
    ]
    assert set(data["modes"]) == {"eager", "inductor"}


def test_fusion_fires_on_small_decoder_check():
    result = ct.fusion_fires_on_small_decoder(layers=1, tokens=5)
    assert result["fusions"] == {"fuse_split_qkv_rmsnorm_rope": 1, "fuse_add_rms_norm": 2}


def test_compiled_matches_eager_check_reports_unsupported_providers():
    sample = next(ops.rms_norm.sample_inputs())
    assert ct.compiled_matches_eager("rms_norm", "native", sample)["how"] == "traced"
    with temporary_impl(ops.rms_norm, "test_wide", _doubled_rms, supports_args=_wide_only):
        narrow = _sample(torch.randn(2, 8), torch.randn(8))
        with pytest.raises(ct.ProviderNotApplicable):
            ct.compiled_matches_eager("rms_norm", "test_wide", narrow)
