"""A compiled graph's staleness guard compares what its cache key is made of, not a
generation counter: scoped settings that leave the key unchanged cost no key computation
and no recompilation; a real change recompiles once per distinct key."""

from __future__ import annotations

import threading

import pytest
import torch

import opcore.compile as oc
from opcore.compile.backend import OpcoreBackend
from opcore.ir import invalidate_caches, ops
from opcore.settings import create_config, get_current_config, set_current_config
from opcore.testing.ir import temporary_impl

WAIT_S = 60


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class CountingBackend(OpcoreBackend):
    """The real backend, counting how often a cache key is computed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keys_computed = 0

    def cache_key(self) -> str:
        self.keys_computed += 1
        return super().cache_key()


def _model(x, w):
    return ops.rms_norm(x, w, 1e-6) * 3


def _compiled():
    be = CountingBackend(mode="eager")
    return torch.compile(_model, backend=be, fullgraph=True), be


def _doubled_rms(x, weight, epsilon, variance_size=None):
    return ops.rms_norm.native(x, weight, epsilon, variance_size) * 2


X, W = torch.randn(2, 16), torch.rand(16) + 0.5


def test_config_scopes_cost_no_key_and_no_recompile():
    compiled, be = _compiled()
    want = _model(X, W)
    with torch.no_grad():
        compiled(X, W)
        before = be.keys_computed
        cfg = get_current_config()
        other = create_config(mode="inductor")  # another config object: compiled graphs keep theirs
        for config in (cfg, other, cfg):
            for _ in range(3):
                with set_current_config(config):
                    torch.testing.assert_close(compiled(X, W), want)
    assert be.keys_computed == before  # the generation counter moved 18 times
    assert len(be.records) == 1


def test_priority_scope_equal_to_the_effective_one_costs_one_key_and_no_recompile():
    compiled, be = _compiled()
    effective = ops.rms_norm.effective_priority()
    with torch.no_grad():
        compiled(X, W)
        before = be.keys_computed
        for _ in range(5):
            with ops.rms_norm.set_priority(effective):
                compiled(X, W)
    # The first block's priority lists are new to the graph: one key computed, equal to
    # the compiled one; the later blocks set the same lists and compute none.
    assert be.keys_computed == before + 1
    assert len(be.records) == 1


def test_registry_bump_recomputes_the_key_but_does_not_recompile():
    compiled, be = _compiled()
    with torch.no_grad():
        compiled(X, W)
        before = be.keys_computed
        invalidate_caches()
        compiled(X, W)
        compiled(X, W)
    assert be.keys_computed == before + 1
    assert len(be.records) == 1


def test_a_real_priority_change_recompiles_once_per_key():
    compiled, be = _compiled()
    with temporary_impl(ops.rms_norm, "guard_doubled", _doubled_rms), torch.no_grad():
        plain = compiled(X, W)
        for _ in range(3):
            with ops.rms_norm.set_priority(["guard_doubled"]):
                torch.testing.assert_close(compiled(X, W), 2 * plain)
            torch.testing.assert_close(compiled(X, W), plain)
        assert len(be.records) == 2  # one variant per key, reused when the key comes back
        assert [r.by_op() for r in be.records] == [
            {"rms_norm": ["native"]},
            {"rms_norm": ["guard_doubled"]},
        ]


def test_threads_with_different_priorities_run_their_own_variant():
    compiled, be = _compiled()
    results: dict[str, list[bool]] = {"plain": [], "doubled": []}
    errors: list[BaseException] = []
    with temporary_impl(ops.rms_norm, "guard_doubled", _doubled_rms), torch.no_grad():
        plain = compiled(X, W)
        with ops.rms_norm.set_priority(["guard_doubled"]):
            compiled(X, W)  # compile both variants up front
        start = threading.Barrier(2, timeout=WAIT_S)

        def worker(kind: str):
            try:
                torch.set_grad_enabled(False)  # grad mode is per thread
                start.wait()
                for _ in range(30):
                    if kind == "doubled":
                        with ops.rms_norm.set_priority(["guard_doubled"]):
                            out = compiled(X, W)
                        results[kind].append(torch.allclose(out, 2 * plain))
                    else:
                        results[kind].append(torch.allclose(compiled(X, W), plain))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in results]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
            assert not t.is_alive()
    assert not errors, errors
    assert results == {"plain": [True] * 30, "doubled": [True] * 30}
    assert len(be.records) == 2


def test_registering_a_fusion_pass_makes_compiled_graphs_recheck():
    compiled, be = _compiled()

    def no_op_pass(graph):
        return 0

    with torch.no_grad():
        compiled(X, W)
        before = be.keys_computed
        oc.register_fusion_pass("guard_test_noop", no_op_pass)
        try:
            compiled(X, W)
        finally:
            oc.unregister_fusion_pass("guard_test_noop")
        compiled(X, W)
    assert be.keys_computed == before + 2
    # the pass is part of the key: the graph compiled again with it, then the first
    # variant came back
    assert len(be.records) == 2
