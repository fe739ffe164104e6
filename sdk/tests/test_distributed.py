"""opcore.distributed on the CPU (gloo, spawned ranks): a tensor-parallel decoder built from
opcore parts matches the single-process decoder, a rank that stops answering makes the
others fail within the bound, and bad arguments are named."""

from __future__ import annotations

import time

import pytest
import torch

from opcore.distributed import (
    RanksFailed,
    check,
    communicator_class,
    get_communicator,
    run_ranks,
)
from opcore.ir import collective_ops, ops

H, HEADS, KV, D, INTER, LAYERS, T, EPS = 64, 4, 2, 16, 96, 2, 5, 1e-6


def _weights() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)

    def w(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    return [
        {
            "in_norm": 1 + w(H),
            "qkv": w((HEADS + 2 * KV) * D, H),
            "o": w(H, HEADS * D),
            "post_norm": 1 + w(H),
            "gate_up": w(2 * INTER, H),
            "down": w(H, INTER),
        }
        for _ in range(LAYERS)
    ]


def _attend(q, k, v, heads, kv):
    # causal attention over the T tokens of one sequence, grouped-query
    q = q.reshape(T, heads, D).transpose(0, 1)
    k = k.reshape(T, kv, D).transpose(0, 1).repeat_interleave(heads // kv, 0)
    v = v.reshape(T, kv, D).transpose(0, 1).repeat_interleave(heads // kv, 0)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(0, 1).reshape(T, heads * D)


def _rope():
    from opcore.layers import RotaryEmbedding

    return RotaryEmbedding(D, D, max_position=64, rope_theta=10000.0, is_neox=True)


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(T, H, generator=g), torch.arange(T)


def single_process_decoder() -> torch.Tensor:
    """The reference: full weights, one process, the same opcore ops."""
    x, pos = _inputs()
    rope = _rope()
    h, residual = x, torch.zeros_like(x)
    for p in _weights():
        h, residual = ops.fused_add_rms_norm(h, residual, p["in_norm"], EPS)
        qkv = h @ p["qkv"].T
        q, k, v = qkv.split([HEADS * D, KV * D, KV * D], dim=-1)
        q, k = rope(pos, q, k)
        h = _attend(q, k, v, HEADS, KV) @ p["o"].T
        h, residual = ops.fused_add_rms_norm(h, residual, p["post_norm"], EPS)
        h = ops.silu_and_mul(h @ p["gate_up"].T) @ p["down"].T
    return ops.fused_add_rms_norm(h, residual, torch.ones(H), EPS)[0]


def tp_decoder(comm) -> dict:
    """The same decoder with weights sharded over the ranks: layer 0 ends its blocks in
    RowParallelLinear's all_reduce then fused_add_rms_norm, layer 1 in
    fused_all_reduce_add_rms_norm; a gathered ColumnParallelLinear is checked too."""
    with torch.no_grad():  # inference: the collectives are not differentiable
        return _tp_decoder(comm)


def _tp_decoder(comm) -> dict:
    from opcore.layers import ColumnParallelLinear, RowParallelLinear, SiluAndMul

    tp = comm.world_size
    x, pos = _inputs()
    rope, act = _rope(), SiluAndMul()
    h, residual = x, torch.zeros_like(x)
    for i, p in enumerate(_weights()):
        fused_end = i == 1
        qkv = ColumnParallelLinear(
            H, (HEADS + 2 * KV) * D, group="world", output_sizes=[HEADS * D, KV * D, KV * D]
        )
        o = RowParallelLinear(HEADS * D, H, group="world", reduce_results=not fused_end)
        gate_up = ColumnParallelLinear(H, 2 * INTER, group="world", output_sizes=[INTER, INTER])
        down = RowParallelLinear(INTER, H, group="world", reduce_results=not fused_end)
        for layer, name in ((qkv, "qkv"), (o, "o"), (gate_up, "gate_up"), (down, "down")):
            layer.load_full_weight(p[name])
        h, residual = ops.fused_add_rms_norm(h, residual, p["in_norm"], EPS)
        q, k, v = qkv(h).split([HEADS * D // tp, KV * D // tp, KV * D // tp], dim=-1)
        q, k = rope(pos, q, k)
        partial = o(_attend(q, k, v, HEADS // tp, KV // tp))
        if fused_end:
            h, residual = ops.fused_all_reduce_add_rms_norm(
                partial, residual, p["post_norm"], EPS, "world"
            )
        else:
            h, residual = ops.fused_add_rms_norm(partial, residual, p["post_norm"], EPS)
        h = down(act(gate_up(h)))
    # the last layer's down projection left its partial sum for the final norm to reduce
    out = ops.fused_all_reduce_add_rms_norm(h, residual, torch.ones(H), EPS, "world")[0]
    gathered = ColumnParallelLinear(
        H, 2 * INTER, group="world", output_sizes=[INTER, INTER], gather_output=True
    )
    gathered.load_full_weight(_weights()[0]["gate_up"])
    return {
        "out": out,
        "gathered": gathered(x),
        "gate_up_full": x @ _weights()[0]["gate_up"].T,
    }


def test_tp2_decoder_matches_the_single_process_decoder():
    with torch.no_grad():
        ref = single_process_decoder()
    r0, r1 = check(run_ranks(tp_decoder, 2, timeout_s=120, comm_timeout_s=30))
    assert torch.equal(r0["out"], r1["out"])  # every rank holds bitwise the same result
    torch.testing.assert_close(r0["out"], ref, atol=2e-5, rtol=2e-5)
    assert not torch.equal(r0["out"], torch.zeros_like(ref))
    # gather_output puts each part's slices back in part order
    torch.testing.assert_close(r0["gathered"], r0["gate_up_full"], atol=1e-5, rtol=1e-5)


def stalled_peer(comm) -> str:
    if comm.rank == 1:
        time.sleep(120)  # never joins the collective below
    return str(ops.all_reduce(torch.ones(8), "world"))


def test_a_stalled_rank_makes_the_other_fail_within_the_bound():
    start = time.monotonic()
    outcomes = run_ranks(stalled_peer, 2, timeout_s=90, comm_timeout_s=2, grace_s=1)
    took = time.monotonic() - start
    assert took < 60, took
    assert outcomes[0].status == "error"
    assert "all_reduce over group 'world' (rank 0 of 2" in outcomes[0].error
    assert outcomes[1].status == "timeout"  # terminated once rank 0 had failed
    with pytest.raises(RanksFailed, match=r"rank 1: timeout .*terminated"):
        check(outcomes)


def test_collective_ops_are_listed_apart_and_name_bad_arguments():
    assert set(collective_ops()) == {"all_reduce", "fused_all_reduce_add_rms_norm"}
    assert ops.all_reduce.schema == "(Tensor x, str group) -> Tensor"
    x = torch.ones(2, 8)
    with pytest.raises(TypeError, match=r"all_reduce: argument 'group': expected a registered"):
        ops.all_reduce(x, 3)
    with pytest.raises(ValueError, match=r"argument 'group'.*empty string"):
        ops.all_reduce(x, "")
    with pytest.raises(ValueError, match=r"fused_all_reduce_add_rms_norm: argument 'residual'"):
        ops.fused_all_reduce_add_rms_norm(x, torch.ones(3, 8), None, 1e-6, "world")
    with pytest.raises(KeyError, match=r"no process group is registered as 'tp'.*init_distributed"):
        ops.all_reduce(x, "tp")
    with pytest.raises(KeyError, match="registered: none"):
        get_communicator("world")


def test_a_platform_communicator_path_is_checked():
    class FakePlatformForPaths:  # only the hook the lookup reads
        name = "paths"

        def __init__(self, path):
            self.path = path

        def get_device_communicator_cls(self):
            return self.path

    from opcore.distributed import TorchCommunicator

    assert communicator_class(FakePlatformForPaths(None)) is TorchCommunicator
    with pytest.raises(ValueError, match="not a dotted path"):
        communicator_class(FakePlatformForPaths("Nothing"))
    with pytest.raises(ValueError, match="does not import"):
        communicator_class(FakePlatformForPaths("no_such_module_xyz.Comm"))
    with pytest.raises(ValueError, match="not a subclass of Communicator"):
        communicator_class(FakePlatformForPaths("torch.Tensor"))


def test_run_ranks_refuses_a_function_the_ranks_cannot_import():
    """Each rank imports ``fn`` (this module, loaded by pytest from its file, included):
    a lambda or a nested function is refused up front, naming it."""

    def nested(comm):
        return comm.rank

    for fn in (lambda comm: comm.rank, nested):
        with pytest.raises(ValueError, match="module-level function"):
            run_ranks(fn, 2, timeout_s=10)


def sigterm_after_returning(comm) -> int:
    """Rank 1 returns, then gets a real SIGTERM as its interpreter exits (after its report
    is flushed to the parent): a rank a signal ended, not one that exited cleanly."""
    if comm.rank == 1:
        import atexit
        import os
        import signal

        atexit.register(os.kill, os.getpid(), signal.SIGTERM)
    return comm.rank * 10


def test_a_rank_ended_by_sigterm_after_returning_is_not_ok():
    """It used to be ``ok`` (exit code -15): and so was every rank, since the launcher gave
    a rank 0.5 s to exit and then terminated it itself."""
    r0, r1 = run_ranks(sigterm_after_returning, 2, timeout_s=90, comm_timeout_s=20)
    assert (r0.status, r0.exitcode, r0.value) == ("ok", 0, 0)  # exited by itself
    assert (r1.status, r1.exitcode, r1.value) == ("died", -15, 10)  # what it reported is kept
    assert r1.error == "returned, then the process ended (SIGTERM, exit code -15)"
    with pytest.raises(RanksFailed, match=r"rank 1: died .*SIGTERM, exit code -15"):
        check([r0, r1])


def hangs_in_teardown(comm) -> int:
    if comm.rank == 1:
        import atexit

        atexit.register(time.sleep, 120)  # after the report: the launcher must end it
    return comm.rank


def test_a_rank_the_launcher_terminates_after_its_report_stays_ok_and_says_so():
    start = time.monotonic()
    r0, r1 = run_ranks(hangs_in_teardown, 2, timeout_s=90, comm_timeout_s=20, grace_s=2)
    assert time.monotonic() - start < 60
    assert r0.status == "ok"  # its exit code: 0 unless it too took over 2 s to exit
    assert (r1.status, r1.exitcode, r1.value) == ("ok", -15, 1)
    assert "still tearing down 2 s after the run, terminated by run_ranks (SIGTERM" in r1.error
    assert check([r0, r1]) == [0, 1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"comm_timeout_s": float("nan")}, "comm_timeout_s must be a finite number > 0, got nan"),
        ({"comm_timeout_s": float("inf")}, "comm_timeout_s must be a finite number > 0, got inf"),
        ({"comm_timeout_s": 0}, "comm_timeout_s must be a finite number > 0, got 0"),
        ({"timeout_s": float("nan")}, "timeout_s must be a finite number > 0, got nan"),
        ({"grace_s": -1.0}, "grace_s must be a finite number >= 0, got -1.0"),
    ],
)
def test_run_ranks_refuses_a_bad_time_bound_before_starting_a_rank(kwargs, message):
    """``comm_timeout_s=nan`` used to reach each rank's process group and fail there."""
    start = time.monotonic()
    with pytest.raises(ValueError, match=message):
        run_ranks(sigterm_after_returning, 2, **kwargs)
    assert time.monotonic() - start < 1.0  # refused up front: no rank was spawned
