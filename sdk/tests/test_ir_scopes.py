"""`set_priority` and `set_current_config` are scoped to the thread and the asyncio task,
and LIFO-safe (blocks left out of order leave no wrong setting behind)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from opcore.scopes import current_scopes
from opcore.settings import create_config, get_current_config, set_current_config
from opcore.testing.ir import temporary_impl, temporary_op

WAIT_S = 10  # every wait in these tests is bounded


def ir_scope_op(x: torch.Tensor) -> torch.Tensor:
    return x


def _tagged(tag: float):
    def ir_scope_op(x):
        return x + tag

    return ir_scope_op


@pytest.fixture
def op():
    """An op with providers ``a`` (adds 1) and ``b`` (adds 2); native adds nothing."""
    with (
        temporary_op(ir_scope_op) as op,
        temporary_impl(op, "a", _tagged(1.0)),
        temporary_impl(op, "b", _tagged(2.0)),
    ):
        yield op


def _run_threads(*targets):
    errors: list[BaseException] = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # reported by the main thread below
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guard(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive(), "a thread did not finish in time"
    if errors:
        raise errors[0]


def test_two_threads_with_different_priorities_see_their_own(op):
    x = torch.zeros(1)
    # Both threads are inside their blocks at the same time, and each calls the op many
    # times while the other one does too.
    both_inside = threading.Barrier(3, timeout=WAIT_S)
    seen: dict[str, set] = {"a": set(), "b": set(), "main": set()}

    def worker(provider: str):
        def run():
            with op.set_priority([provider]):
                both_inside.wait()
                for _ in range(200):
                    seen[provider].add(op(x).item())
                    seen[provider].add(op.dispatch(x).provider)
                    seen[provider].add(tuple(op.effective_priority()))
                both_inside.wait()

        return run

    def main_thread_view():
        both_inside.wait()
        for _ in range(200):  # the thread that opened no block keeps the default
            seen["main"].add(op(x).item())
        both_inside.wait()

    _run_threads(worker("a"), worker("b"), main_thread_view)
    assert seen["a"] == {1.0, "a", ("a",)}
    assert seen["b"] == {2.0, "b", ("b",)}
    assert seen["main"] == {0.0}
    assert op.effective_priority() == ["native"]


def test_two_threads_with_different_current_configs_see_their_own(op):
    x = torch.zeros(1)
    configs = {p: create_config(ir_op_priority={"ir_scope_op": [p]}) for p in ("a", "b")}
    default = get_current_config()
    both_inside = threading.Barrier(2, timeout=WAIT_S)
    seen: dict[str, set] = {"a": set(), "b": set()}

    def worker(provider: str):
        def run():
            assert get_current_config() is default  # a new thread starts with no block open
            with set_current_config(configs[provider]):
                both_inside.wait()
                for _ in range(200):
                    seen[provider].add((op(x).item(), get_current_config() is configs[provider]))
                both_inside.wait()

        return run

    _run_threads(worker("a"), worker("b"))
    assert seen == {"a": {(1.0, True)}, "b": {(2.0, True)}}
    assert get_current_config() is default


def test_two_asyncio_tasks_with_different_priorities_see_their_own(op):
    x = torch.zeros(1)

    async def task(provider: str, out: list):
        with op.set_priority([provider]):
            for _ in range(20):
                await asyncio.sleep(0)  # the other task runs, inside its own block
                out.append((op(x).item(), op.dispatch(x).provider))

    async def main():
        a, b = [], []
        await asyncio.wait_for(asyncio.gather(task("a", a), task("b", b)), WAIT_S)
        return a, b

    a, b = asyncio.run(main())
    assert set(a) == {(1.0, "a")}
    assert set(b) == {(2.0, "b")}
    assert op.dispatch(x).provider == "native"


def test_asyncio_tasks_with_different_current_configs_see_their_own(op):
    x = torch.zeros(1)
    configs = {p: create_config(ir_op_priority={"ir_scope_op": [p]}) for p in ("a", "b")}

    async def task(provider: str, out: list):
        with set_current_config(configs[provider]):
            for _ in range(20):
                await asyncio.sleep(0)
                out.append((op(x).item(), get_current_config() is configs[provider]))

    async def main():
        a, b = [], []
        await asyncio.wait_for(asyncio.gather(task("a", a), task("b", b)), WAIT_S)
        return a, b

    a, b = asyncio.run(main())
    assert set(a) == {(1.0, True)} and set(b) == {(2.0, True)}


def test_priority_blocks_left_out_of_order(op):
    x = torch.zeros(1)
    outer, inner = op.set_priority(["a"]), op.set_priority(["b"])
    outer.__enter__()
    inner.__enter__()
    assert op.dispatch(x).provider == "b"
    outer.__exit__(None, None, None)  # the outer block is left first
    assert op.dispatch(x).provider == "b"  # the inner block is still open
    inner.__exit__(None, None, None)
    assert op.dispatch(x).provider == "native"  # nothing left behind
    assert op(x).item() == 0.0
    assert current_scopes() == ()


def test_config_blocks_left_out_of_order(op):
    x = torch.zeros(1)
    default = get_current_config()
    cfg_a = create_config(ir_op_priority={"ir_scope_op": ["a"]})
    cfg_b = create_config(ir_op_priority={"ir_scope_op": ["b"]})
    first, second = set_current_config(cfg_a), set_current_config(cfg_b)
    first.__enter__()
    second.__enter__()
    assert op(x).item() == 2.0
    first.__exit__(None, None, None)
    assert get_current_config() is cfg_b and op(x).item() == 2.0
    second.__exit__(None, None, None)
    assert get_current_config() is default and op(x).item() == 0.0


def test_interleaved_priority_and_config_blocks(op):
    x = torch.zeros(1)
    cfg = create_config(ir_op_priority={"ir_scope_op": ["a"]})
    with set_current_config(cfg):
        assert op(x).item() == 1.0
        with op.set_priority(["b"]):  # set_priority wins over the config's list
            assert op(x).item() == 2.0
        assert op(x).item() == 1.0
    assert op(x).item() == 0.0


def test_provider_unregistered_inside_a_block_is_named_without_contradiction(op):
    def c(x):
        return x + 3

    x = torch.zeros(1)
    with _registered(op, "c", c):
        with op.set_priority(["c"]):
            assert op(x).item() == 3.0
            op.unregister_impl("c")
            with pytest.raises(ValueError) as info:
                op(x)
            with pytest.raises(ValueError):
                op.effective_priority()
    message = str(info.value)
    # It says what happened (the block's provider went away), not that set_priority was
    # given an unknown name (the block was accepted when it began).
    assert "'c'" in message and "unregistered" in message and "set_priority" in message
    assert "unknown" not in message
    assert "registered providers now: native, a, b" in message
    assert op(x).item() == 0.0  # after the block, dispatch is normal again


class _registered:
    """Register a provider; leave it to the test to remove it."""

    def __init__(self, op, name, fn):
        self.op, self.name, self.fn = op, name, fn

    def __enter__(self):
        self.op.register_impl(self.name)(self.fn)

    def __exit__(self, *exc):
        if self.name in self.op.impls:
            self.op.unregister_impl(self.name)


def test_set_priority_rejects_a_string(op):
    with pytest.raises(TypeError, match="list of provider names"):
        with op.set_priority("a"):
            pass
