"""Provider properties (docs/properties.md), each its own named check, per op x provider x
dtype on the device:

``batch_invariance[op-provider-dtype]``
    32 rows drawn from a pool of 1000 are computed alone, then placed at random positions
    among random neighbours from the pool in batches of 3, 64 and 1000 (two batches of
    each size); each of them must be bitwise equal to the row computed alone.
``capture_safety[op-provider-dtype]``
    After warm-up, one call is captured with the platform's graph mechanism
    (``Platform.capture_graph``), new values are written into every input buffer, the graph
    is replayed, and its outputs are compared with an eager call on the new values
    (bitwise when the provider declares ``deterministic``, else within the op's
    tolerance). ``not_applicable`` where the platform has no graphs.

(``determinism``, the third property, is its own module: every sample, two runs.)

What a result means: a declared property that does not hold is ``fail``; one that holds
is ``pass``; an undeclared one that holds is ``pass`` with "could claim" in its message
(``details.could_claim``), so a vendor can declare it; an undeclared one that does not
hold is ``unsupported``, saying what differed.

The rows come from one of the op's own samples: the first 2-D one (by name order) with
the widest rows whose row count appears in no other argument; every tensor argument with
that many leading entries is a row argument, and the pool draws new rows for each (floats
at the sample's scale, integers in its range).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from opcore_conformance import irapi
from opcore_conformance.case import CheckFailed, NotApplicable, Unsupported
from opcore_conformance.checks._op_grid import call, forced, grid
from opcore_conformance.tensors import bitwise_equal, compare, iter_tensors

BATCH = "batch_invariance"
CAPTURE = "capture_safety"
CHECKS = (BATCH, CAPTURE)

POOL_ROWS = 1000
BATCH_SIZES = (3, 64, 1000)
PROBES = 32  # rows computed alone and followed through the batches
SEED = 0x5EED


def collect(ctx) -> list:
    out: list = []
    chosen: dict[tuple[str, str], str | None] = {}
    for check, make in ((BATCH, _batch_body), (CAPTURE, _capture_body)):
        if not ctx.wants(check=check):
            continue
        for case in grid(ctx, check, make):
            if case.op is None or case.dtype is None:  # opcore.ir missing: one n/a case
                out.append(case)
                continue
            key = (case.op, case.dtype)
            if key not in chosen:
                op = irapi.get_op(case.op)
                picked = pick_row_sample(op, ctx.cache.samples(op, case.dtype, ctx.quick))
                chosen[key] = None if picked is None else picked[0]
            if case.sample == chosen[key]:
                out.append(case)
    return out


# --------------------------------------------------------------------------- verdicts
def verdict(
    declared: bool, prop: str, holds: bool, who: str, what_differed: str, metrics: dict
) -> dict[str, Any]:
    """The case's outcome for property ``prop`` of ``who``: see the module docstring."""
    metrics = {**metrics, "declared": declared, "holds": holds}
    if holds:
        if not declared:
            metrics["could_claim"] = prop
            metrics["message"] = (
                f"{who}: {prop} holds but is not declared: the provider could claim it"
            )
        return metrics
    if declared:
        raise CheckFailed(f"{who} declares {prop}, but {what_differed}", metrics)
    raise Unsupported(f"{who} does not declare {prop} (and it does not hold: {what_differed})")


def capture(
    ctx: Any, step: Callable[[], object], declared: frozenset[str], who: str, what: str
) -> Callable[[], object]:
    """``step`` captured into a device graph (``Platform.capture_graph``): its replay. A
    capture that raises is the ``capture_safe`` `verdict` that does not hold ("capturing
    ``what`` raised ..."; it raises); a platform without graphs raises `NotApplicable`."""
    try:
        replay = ctx.platform.capture_graph(step)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        failed = f"capturing {what} raised {type(exc).__name__}: {text[0] if text else ''}"
        verdict("capture_safe" in declared, "capture_safe", False, who, failed, {})
        raise  # not reached: a verdict that does not hold raises
    if replay is None:
        raise NotApplicable(
            f"platform {ctx.platform.name!r} has no graphs (Platform.capture_graph "
            f"returned None): capture safety cannot be checked here"
        )
    return replay


def declared_properties(op: Any, provider: str) -> frozenset[str]:
    return irapi.provider_properties(irapi.impls(op)[provider])


# --------------------------------------------------------------------------- rows
class RowSample:
    """The row layout of one sample: its arguments and which of them hold rows."""

    def __init__(self, args: tuple, kwargs: dict, rows: int, row_args: list[int]) -> None:
        self.args = args
        self.kwargs = kwargs
        self.rows = rows
        self.row_args = row_args

    def pool(self, n: int, generator: torch.Generator) -> tuple:
        """The sample's arguments with ``n`` fresh rows in each row argument (on the CPU)."""
        args = list(self.args)
        for i in self.row_args:
            args[i] = _fresh(self.args[i], n, generator)
        return tuple(args)

    def take(self, pool: tuple, index: torch.Tensor) -> tuple:
        """The pool's rows ``index`` (in that order), contiguous, other arguments as they
        are."""
        args = list(pool)
        for i in self.row_args:
            args[i] = pool[i].index_select(0, index.to(pool[i].device)).contiguous()
        return tuple(args)


def _fresh(t: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    shape = (n, *t.shape[1:])
    if t.is_floating_point():
        ref = t.float()
        scale = float(ref.std()) if ref.numel() > 1 else 1.0
        if not scale > 0 or scale != scale or scale == float("inf"):
            scale = 1.0
        return (torch.randn(shape, generator=generator) * scale).to(t.dtype)
    hi = int(t.max()) if t.numel() else 0
    return torch.randint(0, hi + 1, shape, generator=generator, dtype=t.dtype)


def pick_row_sample(op: Any, samples: list) -> tuple[str, RowSample] | None:
    """The sample the rows come from (see the module docstring), or None."""
    best: tuple[int, str, RowSample] | None = None
    for sample in samples:
        if sample.kwargs:
            continue
        args = tuple(sample.args)
        first = args[0] if args else None
        if not isinstance(first, torch.Tensor) or first.ndim not in (1, 2):
            continue
        rows = first.shape[0]
        if rows < 2:
            continue
        row_args: list[int] = []
        clash = False
        width = 0
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            if a.ndim in (1, 2) and a.shape[0] == rows and a.is_contiguous():
                row_args.append(i)
                width = max(width, a.numel() // rows)
            elif rows in a.shape or a.ndim > 2:
                clash = True
        if clash or not row_args:
            continue
        if best is None or width > best[0]:
            best = (width, sample.name, RowSample(args, {}, rows, row_args))
    return None if best is None else (best[1], best[2])


def _outputs(out: Any) -> list[tuple[str, torch.Tensor | None]]:
    return list(iter_tensors(out))


# --------------------------------------------------------------------------- batch invariance
def batch_layouts(generator: torch.Generator) -> Iterator[tuple[int, list[int], list[int]]]:
    """``(batch size, probe rows, their positions)``: two batches of each size, each
    holding as many of the `PROBES` probe rows as fit, at random distinct positions,
    the other positions filled with random rows of the pool."""
    probes = torch.randperm(POOL_ROWS, generator=generator)[:PROBES].tolist()
    for batch in BATCH_SIZES:
        for turn in range(2):
            k = min(batch, PROBES)
            start = (turn * k) % PROBES
            chosen = [probes[(start + i) % PROBES] for i in range(k)]
            where = torch.randperm(batch, generator=generator)[:k].tolist()
            yield batch, chosen, where


def _row_case(
    ctx: Any, op_name: str, provider: str, dtype: str, sample_name: str
) -> tuple[Any, RowSample, str]:
    """The op, the row layout of its sample ``sample_name`` (the one `pick_row_sample`
    draws rows from, else `Unsupported`) and the case's subject for messages."""
    op = irapi.get_op(op_name)
    picked = pick_row_sample(op, ctx.cache.samples(op, dtype, ctx.quick))
    if picked is None or picked[0] != sample_name:
        raise Unsupported(f"{op_name}: this sample is not the one rows are drawn from")
    return op, picked[1], f"{op_name} with provider {provider!r}"


def _batch_indices(batch: int, probes: list[int], where: list[int], g) -> torch.Tensor:
    index = torch.randint(0, POOL_ROWS, (batch,), generator=g)
    for row, pos in zip(probes, where, strict=True):
        index[pos] = row
    return index


def _batch_body(op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        op, rows, who = _row_case(ctx, op_name, provider, dtype, sample_name)
        g = torch.Generator().manual_seed(SEED)
        pool_cpu = rows.pool(POOL_ROWS, g)
        pool = tuple(a.to(ctx.device) if isinstance(a, torch.Tensor) else a for a in pool_cpu)

        def run(index: torch.Tensor) -> list:
            args = rows.take(pool, index)
            with forced(op, provider, args, {}):
                return _outputs(call(who, op, *args))

        layouts = list(batch_layouts(g))
        probes = sorted({p for _, ps, _ in layouts for p in ps})
        alone = {p: run(torch.tensor([p])) for p in probes}
        bad: list[str] = []
        checked = 0
        for batch, ps, where in layouts:
            outs = run(_batch_indices(batch, ps, where, g))
            for p, pos in zip(ps, where, strict=False):
                for (path, t), (_, ref) in zip(outs, alone[p], strict=False):
                    if t is None or ref is None:
                        continue
                    checked += 1
                    if not bitwise_equal(t[pos], ref[0]):
                        bad.append(f"{path} of row {p} at position {pos} of a batch of {batch}")
        ctx.platform.synchronize()
        metrics = {
            "rows_checked": checked,
            "batch_sizes": [1, *BATCH_SIZES],
            "mismatched": len(bad),
        }
        differed = (
            f"{len(bad)} of {checked} row outputs differ from the row computed alone, e.g. "
            + "; ".join(bad[:3])
        )
        return verdict(
            "batch_invariant" in declared_properties(op, provider),
            "batch_invariant",
            not bad,
            who,
            differed,
            metrics,
        )

    return body


# --------------------------------------------------------------------------- capture safety
def _capture_body(op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, tol) -> dict[str, Any]:
        op, rows, who = _row_case(ctx, op_name, provider, dtype, sample_name)
        declared = declared_properties(op, provider)
        g = torch.Generator().manual_seed(SEED + 1)
        args_cpu = rows.pool(rows.rows, g)
        args = tuple(a.to(ctx.device) if isinstance(a, torch.Tensor) else a for a in args_cpu)
        holder: dict[str, Any] = {}

        def step() -> None:
            holder["out"] = op(*args)

        with forced(op, provider, args, {}):
            replay = capture(ctx, step, declared, who, "it")
            # New values into the captured buffers: rows, weights, tables alike.
            for a, a_cpu in zip(args, args_cpu, strict=True):
                if isinstance(a, torch.Tensor) and a.ndim:
                    a.copy_(_fresh(a_cpu, a.shape[0], g))
            try:
                replay()
                ctx.platform.synchronize()
            except Exception as exc:
                return verdict(
                    "capture_safe" in declared,
                    "capture_safe",
                    False,
                    who,
                    f"replaying its graph raised {type(exc).__name__}: {exc}",
                    {},
                )
            replayed = [(p, None if t is None else t.clone()) for p, t in _outputs(holder["out"])]
            eager = _outputs(call(who, op, *args))
        ctx.platform.synchronize()
        exact = "deterministic" in declared
        atol, rtol = (tol.atol, tol.rtol) if tol is not None else irapi.tolerance(op, dtype)
        bad: list[str] = []
        worst = 0.0
        for (path, r), (_, e) in zip(replayed, eager, strict=False):
            if r is None or e is None:
                continue
            if exact:
                if not bitwise_equal(r, e):
                    bad.append(path)
            else:
                m = compare(r, e, atol, rtol)
                worst = max(worst, float(m.get("max_ratio") or 0.0))
                if m.get("mismatched"):
                    bad.append(path)
        metrics: dict[str, Any] = {
            "compared": "bitwise" if exact else f"atol={atol:g}, rtol={rtol:g}"
        }
        if not exact:
            metrics["max_ratio"] = worst
        return verdict(
            "capture_safe" in declared,
            "capture_safe",
            not bad,
            who,
            f"the replayed graph's {', '.join(bad)} differ from an eager call on the new "
            f"values ({metrics['compared']})",
            metrics,
        )

    return body
