"""Collective checks, run inside each rank of ``opcore conformance --world-size N``.

Each rank runs the same cases in the same order (a collective needs every rank) and
returns one record per case: ``{"id", "status", "detail", "digests", "metrics"}``. The
parent (`opcore_conformance.world`) compares the ``digests`` (SHA-256 of each output's
bytes) across ranks: a case passes only when every rank passed it and every rank's
outputs are bitwise the same.

Inputs are drawn on the CPU from a seed made of the case and the rank, so every rank can
draw every other rank's inputs too: the float64 reference of a sum over ranks is computed
locally, without trusting the communicator under test.
"""

from __future__ import annotations

import hashlib
import traceback
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from opcore_conformance import status as S

# (name, shape, strided): strided inputs are rows of a 3x wider buffer (like q of a QKV
# projection), which a communicator must make contiguous itself.
SHAPES = (
    ("t1_h8", (1, 8), False),
    ("t5_h4096", (5, 4096), False),
    ("t3_h7_odd", (3, 7), False),
    ("3d_2x3x64", (2, 3, 64), False),
    ("strided_rows_t6_h96", (6, 96), True),
    ("t64_h2048", (64, 2048), False),
)
DTYPES = ("float32", "float16", "bfloat16")


def _seed(*parts: object) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


def _draw(shape: tuple[int, ...], strided: bool, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if strided:
        buf = torch.randn((*shape[:-1], 3 * shape[-1]), generator=g).to(dtype)
        return buf[..., shape[-1] : 2 * shape[-1]]
    return torch.randn(shape, generator=g).to(dtype)


def _sum64(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The float64 sum of the ranks' tensors, in rank order."""
    total = torch.zeros(tensors[0].shape, dtype=torch.float64)
    for t in tensors:
        total += t.double()
    return total


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        c = t.detach().contiguous().cpu()
        h.update(str((tuple(c.shape), c.dtype)).encode())
        h.update(c.view(torch.uint8).numpy().tobytes() if c.numel() else b"")
    return h.hexdigest()


def _close(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> tuple[bool, float]:
    diff = (got.double().cpu() - ref).abs()
    bound = atol + rtol * ref.abs()
    return bool((diff <= bound).all()), float(diff.max()) if diff.numel() else 0.0


def _rms_ref(h: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    out = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    return out * weight.double() if weight is not None else out


class Case:
    """One record under construction; the body raises `Failed` or returns details."""

    def __init__(self, case_id: str):
        self.id = case_id
        self.digests: list[str] = []
        self.metrics: dict[str, Any] = {}


class Failed(AssertionError):
    pass


def run(comm: Any, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every collective case on this rank, in a fixed order. ``cfg``: ``dtypes``,
    ``ops``, ``providers`` (``None`` = all)."""
    import importlib

    for module in cfg.get("imports") or ():  # providers no plugin registers (--import)
        importlib.import_module(module)
    records = []
    for case_id, body in _cases(comm, cfg):
        case = Case(case_id)
        try:
            detail = body(case) or ""
            status = S.NOT_APPLICABLE if detail.startswith("n/a: ") else S.PASS
            detail = detail.removeprefix("n/a: ")
        except Failed as exc:
            status, detail = S.FAIL, str(exc)
        except Exception as exc:  # the op or communicator raised: a failure of the case
            status = S.FAIL
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0] + "\n" + traceback.format_exc()
        records.append(
            {
                "id": case.id,
                "status": status,
                "detail": detail,
                "digests": case.digests,
                "metrics": case.metrics,
            }
        )
    return records


def _cases(comm: Any, cfg: dict[str, Any]) -> Iterator[tuple[str, Callable[[Case], str | None]]]:
    from opcore.distributed import communicator_class
    from opcore.ir import collective_ops
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    dtypes = [
        d for d in (cfg.get("dtypes") or DTYPES) if getattr(torch, d) in platform.supported_dtypes
    ]
    yield "collective.communicator", lambda case: _communicator(comm, communicator_class())
    for dt in dtypes:
        yield f"collective.primitives[{dt}]", _bind_primitives(comm, dt)
    for name, op in collective_ops().items():
        if cfg.get("ops") and name not in cfg["ops"]:
            continue
        for provider, impl in op.impls.items():
            if cfg.get("providers") and provider not in cfg["providers"]:
                continue
            if not impl.supported:
                continue
            for dt in dtypes:
                for sample, shape, strided in SHAPES:
                    if name not in ("all_reduce", "fused_all_reduce_add_rms_norm"):
                        continue  # a plugin's own collective op: no reference known here
                    cid = f"collective.{name}[{provider}-{dt}-{sample}]"
                    yield cid, _bind(comm, op, provider, dt, sample, shape, strided)
    yield "collective.capture", lambda case: _capture(comm, platform, case)


def _bind_primitives(comm: Any, dt: str) -> Callable[[Case], str | None]:
    return lambda case: _primitives(comm, case, dt)


def _bind(comm, op, provider, dt, sample, shape, strided) -> Callable[[Case], str | None]:
    body = _all_reduce_case if op.name == "all_reduce" else _fused_case
    return lambda case: body(comm, case, op, provider, dt, sample, shape, strided)


def _communicator(comm: Any, expected_cls: type) -> str:
    import torch.distributed as dist

    problems = []
    if type(comm) is not expected_cls:
        problems.append(
            f"the 'world' communicator is {type(comm).__name__}, but the platform names "
            f"{expected_cls.__name__}"
        )
    if (comm.rank, comm.world_size) != (dist.get_rank(), dist.get_world_size()):
        problems.append(
            f"rank/world_size {comm.rank}/{comm.world_size} differ from torch.distributed's "
            f"{dist.get_rank()}/{dist.get_world_size()}"
        )
    if not isinstance(type(comm).capture_safe, bool):
        problems.append(f"capture_safe is {type(comm).capture_safe!r}, not a bool")
    if not 0 < comm.timeout_s < float("inf"):
        problems.append(f"timeout_s is {comm.timeout_s!r}: waits would be unbounded")
    if problems:
        raise Failed("; ".join(problems))
    return f"{type(comm).__name__}, backend {dist.get_backend()}, capture_safe={comm.capture_safe}"


def _primitives(comm: Any, case: Case, dt: str) -> str:
    """all_gather (dims 0 and -1) and broadcast are exact; reduce_scatter is a sum."""
    dtype, n, dev = getattr(torch, dt), comm.world_size, comm.device
    shape = (2 * n, 24)
    xs = [_draw(shape, False, _seed("prim", dt, r), dtype) for r in range(n)]
    mine = xs[comm.rank].to(dev)
    problems = []
    for dim in (0, -1):
        got = comm.all_gather(mine, dim=dim).cpu()
        case.digests.append(_digest(got))
        if not torch.equal(got, torch.cat(xs, dim=dim)):
            problems.append(f"all_gather(dim={dim}) is not the ranks' tensors concatenated")
    for src in range(n):
        got = comm.broadcast(mine, src=src).cpu()
        case.digests.append(_digest(got))
        if not torch.equal(got, xs[src]):
            problems.append(f"broadcast(src={src}) differs from rank {src}'s tensor")
    # reduce_scatter gives each rank its own chunk: no digest to compare across ranks
    got = comm.reduce_scatter(mine, dim=0).cpu()
    ref = _sum64(xs).chunk(n, dim=0)[comm.rank]
    from opcore.ir import ops

    atol, rtol = ops.all_reduce.tolerance(dtype)
    ok, err = _close(got, ref, atol * max(1, n - 1), rtol * max(1, n - 1))
    if not ok:
        problems.append(f"reduce_scatter: max |err| {err:.3g} vs the float64 sum")
    if not torch.equal(mine.cpu(), xs[comm.rank]):
        problems.append("an input was modified")
    comm.barrier()
    if problems:
        raise Failed("; ".join(problems))
    return ""


def _inputs(op_name, sample, shape, strided, dt, n):
    dtype = getattr(torch, dt)
    return [_draw(shape, strided, _seed(op_name, sample, dt, "rank", r), dtype) for r in range(n)]


def _all_reduce_case(comm, case, op, provider, dt, sample, shape, strided) -> str:
    dtype, n = getattr(torch, dt), comm.world_size
    xs = _inputs(op.name, sample, shape, strided, dt, n)
    x = xs[comm.rank].to(comm.device)
    before = x.clone()
    with op.set_priority([provider]):
        got = op(x, "world")
    case.digests.append(_digest(got))
    ref = _sum64(xs)
    atol, rtol = op.tolerance(dtype)
    # each of the n - 1 additions may round once in the input dtype
    ok, err = _close(got, ref, atol * max(1, n - 1), rtol * max(1, n - 1))
    case.metrics["max_abs_err"] = err
    if got.shape != x.shape or got.dtype != x.dtype:
        raise Failed(f"output {tuple(got.shape)} {got.dtype}, expected {tuple(x.shape)} {x.dtype}")
    if not torch.equal(x, before):
        raise Failed("the input x was modified (the op's default overload must not mutate)")
    if not ok:
        raise Failed(
            f"max |err| {err:.3g} vs the float64 sum over ranks exceeds atol={atol}, "
            f"rtol={rtol} (x{max(1, n - 1)})"
        )
    if op.impls[provider].inplace:  # the donated form, on freshly drawn inputs
        fresh = _inputs(op.name, sample, shape, strided, dt, n)[comm.rank].to(comm.device)
        with op.set_priority([provider]):
            donated = op.maybe_inplace(fresh, "world")
        case.digests.append(_digest(donated))
        ok, err = _close(donated, ref, atol * max(1, n - 1), rtol * max(1, n - 1))
        case.metrics["maybe_inplace_equals_default"] = bool(torch.equal(donated, got))
        if not ok:
            raise Failed(f"maybe_inplace: max |err| {err:.3g} vs the float64 sum over ranks")
    return ""


def _fused_case(comm, case, op, provider, dt, sample, shape, strided) -> str:
    from opcore.ir import ops

    dtype, n, dev = getattr(torch, dt), comm.world_size, comm.device
    xs = _inputs(op.name, sample, shape, strided, dt, n)
    residual = _draw(shape, False, _seed(op.name, sample, dt, "residual"), dtype)
    g = torch.Generator().manual_seed(_seed(op.name, sample, "weight"))
    weight = (1.0 + 0.5 * torch.randn(shape[-1], generator=g)).to(dtype)
    eps = 1e-6
    x, r, w = xs[comm.rank].to(dev), residual.to(dev), weight.to(dev)
    before = (x.clone(), r.clone())
    with op.set_priority([provider]):
        out, h = op(x, r, w, eps, "world")
    unfused_out, unfused_h = ops.fused_add_rms_norm(comm.all_reduce(x), r, w, eps)
    case.digests.append(_digest(out, h))
    h_ref = _sum64(xs) + residual.double()
    out_ref = _rms_ref(h_ref, weight, eps)
    atol, rtol = op.tolerance(dtype)
    scale = max(1, n - 1)
    ok_h, err_h = _close(h, h_ref, 2 * atol * scale, 2 * rtol * scale)
    ok_o, err_o = _close(out, out_ref, atol * scale, rtol * scale)
    bitwise_unfused = torch.equal(out, unfused_out) and torch.equal(h, unfused_h)
    case.metrics.update(
        max_abs_err_out=err_o,
        max_abs_err_residual=err_h,
        bitwise_equal_unfused=bitwise_unfused,
        max_abs_diff_unfused=float((out.double() - unfused_out.double()).abs().max()),
    )
    if not (torch.equal(x, before[0]) and torch.equal(r, before[1])):
        raise Failed("an input was modified (the op's default overload must not mutate)")
    if not ok_h:
        raise Failed(f"residual output: max |err| {err_h:.3g} vs float64 sum + residual")
    if not ok_o:
        raise Failed(
            f"normed output: max |err| {err_o:.3g} vs float64 exceeds atol={atol}, rtol={rtol}"
        )
    if op.impls[provider].inplace:  # the donated form, on freshly drawn inputs
        fx = _inputs(op.name, sample, shape, strided, dt, n)[comm.rank].to(dev)
        fr = residual.clone().to(dev)
        with op.set_priority([provider]):
            d_out, d_h = op.maybe_inplace(fx, fr, w, eps, "world")
        case.digests.append(_digest(d_out, d_h))
        ok_dh, _ = _close(d_h, h_ref, 2 * atol * scale, 2 * rtol * scale)
        ok_do, err_do = _close(d_out, out_ref, atol * scale, rtol * scale)
        case.metrics["maybe_inplace_equals_default"] = bool(
            torch.equal(d_out, out) and torch.equal(d_h, h)
        )
        if not (ok_dh and ok_do):
            raise Failed(f"maybe_inplace: max |err| {err_do:.3g} vs float64 (normed output)")
    if provider == "native" and not bitwise_unfused:
        # native is declared to be the unfused sequence (docs/distributed.md)
        raise Failed(
            "native is not bitwise equal to all_reduce then fused_add_rms_norm: max |diff| "
            f"{case.metrics['max_abs_diff_unfused']:.3g}"
        )
    return ""


def _capture(comm: Any, platform: Any, case: Case) -> str:
    """A capture-safe communicator's all-reduce, captured once, replays with new values."""
    from opcore.ir import ops

    if not type(comm).capture_safe:
        return f"n/a: {type(comm).__name__} does not declare capture_safe"
    dtype = torch.float32
    n, dev = comm.world_size, comm.device
    first = [_draw((4, 256), False, _seed("capture", 0, r), dtype) for r in range(n)]
    second = [_draw((4, 256), False, _seed("capture", 1, r), dtype) for r in range(n)]
    static = first[comm.rank].to(dev)
    holder: dict[str, torch.Tensor] = {}

    def step() -> None:
        holder["out"] = ops.all_reduce(static, "world")

    replay = platform.capture_graph(step)
    if replay is None:
        return (
            f"n/a: {type(comm).__name__} declares capture_safe, but platform "
            f"{platform.name!r} captures no graphs"
        )
    static.copy_(second[comm.rank].to(dev))
    replay()
    platform.synchronize()
    got = holder["out"].cpu()
    case.digests.append(_digest(got))
    ref = _sum64(second)
    ok, err = _close(got, ref, 1e-5 * max(1, n - 1), 1.3e-6 * max(1, n - 1))
    comm.barrier()
    if not ok:
        raise Failed(
            f"replayed all_reduce differs from the float64 sum of the new values: {err:.3g}"
        )
    return "captured all_reduce replayed with new input values"


def killed_rank(comm: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """The last rank exits abruptly after a barrier; every other rank then calls
    ``all_reduce`` and a barrier and must fail with an error (not hang). Returns what
    happened on this rank."""
    import os
    import time

    from opcore.ir import ops

    comm.barrier()
    if comm.rank == comm.world_size - 1:
        os._exit(17)  # abrupt: no teardown, no goodbye to the peers
    time.sleep(0.5)  # let the peer's exit land first
    x = torch.ones(1024, device=comm.device)
    start = time.monotonic()
    try:
        ops.all_reduce(x, "world")
        comm.barrier()
    except Exception as exc:
        return {
            "raised": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            "elapsed_s": time.monotonic() - start,
        }
    return {"raised": None, "elapsed_s": time.monotonic() - start}
