"""`opcore tune`'s search: per op x shape bucket x dtype, gate, time, choose, write.

For each bucket (the `opcore.bench.cases` arguments of an op at ``tokens`` x ``hidden``):

1. The float64 reference and native's error (`opcore.tuner.gate`).
2. The incumbent: the provider dispatch picks now, with its own heuristic configuration.
3. Every candidate: each supported provider that accepts the arguments (and declares the
   required properties), with its heuristic and each configuration of its launch space,
   nearest the heuristic first.
   A candidate is run once (out of place) and gated; a wrong one is recorded as rejected
   and never timed. A passing one is timed exactly as `opcore bench` times the op and
   shape, through the one procedure both use (`opcore.bench.timing.bench_samples_us`):
   the provider's own function (in place where the provider works in place) on a copy of
   the arguments; graph replay of about 1 ms of calls at decode sizes (at most
   `opcore.bench.timing.GRAPH_TOKENS` tokens) where the platform has graphs, else timing
   events around each call after a cache flush; the host clock where the platform has no
   events.
4. A provider's best configuration (faster than the rest beyond noise: by more than
   ``max(min_gain, (spread_a + spread_b) / 2)``, spread being the interquartile range
   over the median) is kept only when it also wins `confirm` against the provider's
   heuristic: the two measured in alternation, ``CONFIRM_ROUNDS`` pairs, the upper quartile
   of the per-round ratios below ``1 - min_gain``. A provider replaces the incumbent at the
   head of the order only when it wins `confirm` against the incumbent (with the
   incumbent's kept configuration) in the same way; those timed faster than the incumbent
   are tried fastest first, and the first that wins takes the head. A drift between two
   separate measurements cannot pick a loser: both sides of every comparison that changes
   a choice are measured side by side.

``budget_s`` bounds the whole search: each bucket gets an equal share of what is left,
the incumbent is always measured, and candidates are tried until the share is spent.
With ``batch_invariant`` among the required properties, a space whose parameters order a
reduction gets one configuration per shape for every token bucket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from opcore.bench import timing
from opcore.tuner import gate
from opcore.tuning import runtime, table
from opcore.tuning.buckets import key_function
from opcore.tuning.space import space_for

MIN_GAIN = 0.01
# Alternated incumbent / candidate pairs a change must win (`confirm`).
CONFIRM_ROUNDS = 5
# Milliseconds per timer per candidate: `opcore bench`'s default, so that both take the
# same samples.
REP_MS = 60.0


@dataclasses.dataclass
class Options:
    ops: tuple[str, ...]
    tokens: tuple[int, ...]
    hidden: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)
    budget_s: float = 180.0
    out: str | None = None
    quick: bool = False
    providers: tuple[str, ...] | None = None
    properties: tuple[str, ...] = ()
    rep_ms: float = REP_MS
    min_gain: float = MIN_GAIN
    log: Callable[[str], None] = print


@dataclasses.dataclass
class Timing:
    median_us: float
    spread: float  # interquartile range / median
    samples: int
    timer: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_us": round(self.median_us, 3),
            "spread": round(self.spread, 4),
            "samples": self.samples,
            "timer": self.timer,
        }


def beats(a: Timing, b: Timing, min_gain: float) -> bool:
    """``a`` is faster than ``b`` beyond noise."""
    margin = max(min_gain, (a.spread + b.spread) / 2)
    return a.median_us < b.median_us * (1 - margin)


class Timer:
    """`opcore bench`'s procedure (`opcore.bench.timing.bench_samples_us`), read the way
    its results are compared (`opcore.bench.timing.compared_timer`): graph replay at decode
    sizes where the platform has graphs, device time after a cache flush above them, the
    host clock where the platform has no timing events."""

    def __init__(self, platform: Any, device: torch.device, rep_ms: float):
        self.platform = platform
        self.rep_ms = rep_ms
        self.timers = timing.timers(platform, device)

    @property
    def kind(self) -> str:
        return "device" if self.timers == "device" else "host"

    def measure(self, fn: Callable[[], object], tokens: int) -> Timing:
        samples = timing.bench_samples_us(
            fn,
            self.platform,
            self.timers,
            rep_ms=max(1, round(self.rep_ms)),
            graph=tokens <= timing.GRAPH_TOKENS,
        )
        timer = timing.compared_timer(samples, tokens)
        sp = timing.spread(samples[timer])
        return Timing(sp.median_us, sp.rel_iqr, sp.reps, timer)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One provider with one configuration (``None``: its heuristic), timed through the
    callable `opcore bench` times: the provider's own function (in place where the
    provider works in place), on the bucket's timing copy of the arguments."""

    provider: str
    config: dict[str, int] | None
    fn: Callable[[], object]
    op_name: str

    def context(self) -> contextlib.AbstractContextManager[None]:
        if self.config is None:
            return contextlib.nullcontext()
        return runtime.forced(self.op_name, self.provider, self.config)


def confirm(
    timer: Timer,
    candidate: Candidate,
    incumbent: Candidate,
    tokens: int,
    min_gain: float,
    rounds: int = CONFIRM_ROUNDS,
) -> dict[str, Any]:
    """Whether ``candidate`` beats ``incumbent`` beyond noise, both measured by the same
    procedure in alternation (``rounds`` pairs, the pair's order swapped every round, so a
    drift of the device or host between them falls on both): accepted when the upper
    quartile of the per-round ratios candidate / incumbent is below ``1 - min_gain``, that is
    in at least three rounds of four the candidate is faster by more than ``min_gain``.
    The evidence (ratios, medians) is returned with ``"accepted"``."""
    ratios: list[float] = []
    cand_us: list[float] = []
    inc_us: list[float] = []
    for i in range(rounds):
        pair = (incumbent, candidate) if i % 2 == 0 else (candidate, incumbent)
        got: dict[int, float] = {}
        for c in pair:
            with c.context():
                got[id(c)] = timer.measure(c.fn, tokens).median_us
        cand_us.append(got[id(candidate)])
        inc_us.append(got[id(incumbent)])
        ratios.append(got[id(candidate)] / max(got[id(incumbent)], 1e-9))
    q = timing.spread(ratios)
    return {
        "accepted": q.p75_us < 1 - min_gain,
        "ratio_median": round(q.median_us, 4),
        "ratio_p75": round(q.p75_us, 4),
        "candidate_us": round(statistics.median(cand_us), 3),
        "incumbent_us": round(statistics.median(inc_us), 3),
        "rounds": rounds,
    }


def _distance(config: dict[str, int], default: dict[str, int]) -> float:
    """How far ``config`` is from ``default``, in powers of two summed over parameters."""
    return sum(abs(math.log2(max(v, 1) / max(default.get(k, v), 1))) for k, v in config.items())


def _config_key(cfg: Any) -> str:
    return "heuristic" if cfg is None else ",".join(f"{k}={v}" for k, v in sorted(cfg.items()))


def _candidate_providers(op: Any, args: tuple, opts: Options) -> list[str]:
    out = []
    for name, impl in op.impls.items():
        if not impl.supported or (opts.providers and name not in opts.providers):
            continue
        props = getattr(impl, "properties", None)
        if opts.properties and props is not None and not props.has(opts.properties):
            continue
        if impl.supports_args is None or impl.supports_args(*args) is True:
            out.append(name)
    return out


def tune_bucket(
    op: Any, args: tuple, timer: Timer, deadline: float, opts: Options
) -> dict[str, Any]:
    """Gate and time every candidate for one bucket; the table entry (with its evidence)."""
    keyfn = key_function(op.name)
    assert keyfn is not None
    dtype, tokens, shape = keyfn(*args)
    ref = gate.reference(op, args, dtype)
    incumbent = op.dispatch(*args).provider
    providers = _candidate_providers(op, args, opts)
    if incumbent in providers:  # measured first: it is what a better choice must beat
        providers.remove(incumbent)
        providers.insert(0, incumbent)
    # Timed on a copy, as `opcore bench` times every provider on its case's arguments: an
    # in-place provider overwrites them, and the gate needs the originals.
    timed_args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    measured: dict[str, dict[str, Any]] = {}
    rejected: list[dict[str, Any]] = []
    best: dict[str, tuple[Any, Timing]] = {}
    heuristic: dict[str, Timing] = {}
    for prov in providers:
        impl = op.impls[prov]
        space = space_for(op.name, prov)
        configs: list[Any] = [None]
        if space is not None:
            default = dict(space.default(tokens, shape))
            others = [dict(c) for c in space.candidates(tokens, shape) if dict(c) != default]
            # Nearest the heuristic first: the budget may end the list early.
            others.sort(key=lambda c: _distance(c, default))
            configs += others
        rows = measured.setdefault(prov, {})
        for cfg in configs:
            if cfg is not None and time.perf_counter() > deadline:
                rows["(budget)"] = f"{len(configs) - len(rows)} configurations not tried"
                break
            ctx = (
                runtime.forced(op.name, prov, cfg) if cfg is not None else contextlib.nullcontext()
            )
            with ctx:
                try:
                    value = impl.functional(*args)
                except Exception as exc:  # a configuration the kernel cannot launch
                    rejected.append(
                        {"provider": prov, "config": cfg, "reason": f"{type(exc).__name__}: {exc}"}
                    )
                    continue
                verdict = gate.check(ref, value)
                del value
                if not verdict.ok:
                    rejected.append({"provider": prov, "config": cfg, "reason": verdict.reason})
                    continue
                try:
                    t = timer.measure(functools.partial(impl.impl_fn, *timed_args), tokens)
                except Exception as exc:  # capture or replay refused this candidate
                    rejected.append(
                        {"provider": prov, "config": cfg, "reason": f"timing failed: {exc}"}
                    )
                    continue
            rows[_config_key(cfg)] = {
                **t.to_dict(),
                "peak_ulp": [round(p, 3) for p in verdict.peaks],
            }
            if cfg is None:
                heuristic[prov] = t
                best[prov] = (None, t)
            elif prov not in best or beats(t, best[prov][1], opts.min_gain):
                best[prov] = (dict(cfg), t)

    def cand(prov: str, cfg: Any) -> Candidate:
        return Candidate(prov, cfg, functools.partial(op.impls[prov].impl_fn, *timed_args), op.name)

    # A change is kept only when it wins the alternated comparison against what it would
    # replace: a provider's configuration against its heuristic, then the new head of the
    # order against the incumbent, else the incumbent stays.
    confirmations: list[dict[str, Any]] = []
    for prov, (cfg, _t) in list(best.items()):
        if cfg is None or prov not in heuristic:
            continue
        verdict_c = confirm(timer, cand(prov, cfg), cand(prov, None), tokens, opts.min_gain)
        confirmations.append({"provider": prov, "config": cfg, "against": "heuristic", **verdict_c})
        if not verdict_c["accepted"]:
            best[prov] = (None, heuristic[prov])
    ranked = sorted(best, key=lambda p: best[p][1].median_us)
    order = list(ranked)
    if incumbent in best:
        # Each provider timed faster than the incumbent, fastest first, until one wins the
        # alternated comparison against the incumbent (with its kept configuration).
        order = [incumbent] + [p for p in ranked if p != incumbent]
        for prov in ranked[: ranked.index(incumbent)]:
            verdict_h = confirm(
                timer,
                cand(prov, best[prov][0]),
                cand(incumbent, best[incumbent][0]),
                tokens,
                opts.min_gain,
            )
            confirmations.append(
                {"provider": prov, "config": best[prov][0], "against": "incumbent", **verdict_h}
            )
            if verdict_h["accepted"]:
                order = [prov] + [p for p in ranked if p != prov]
                break
    configs_out: dict[str, dict[str, int]] = {}
    for prov, (cfg, _t) in best.items():
        space = space_for(op.name, prov)
        if space is None:
            continue
        # The heuristic's choice is written out too: an unseen size near this one then
        # borrows what was measured here, not a neighbour's tuned choice.
        configs_out[prov] = dict(cfg) if cfg is not None else dict(space.default(tokens, shape))
    return {
        "op": op.name,
        "dtype": str(dtype).removeprefix("torch."),
        "tokens": int(tokens),
        "shape": list(shape),
        "order": order,
        "configs": configs_out,
        "incumbent": incumbent,
        "measured": measured,
        "best": {p: {"config": c, **t.to_dict()} for p, (c, t) in best.items()},
        "heuristic": {p: t.to_dict() for p, t in heuristic.items()},
        "rejected": rejected,
        "confirmations": confirmations,
    }


def _hold_reductions(entries: list[dict[str, Any]]) -> None:
    """Batch invariance: one configuration per (op, provider, dtype, shape) for every
    token bucket where the space's parameters order a reduction: the one measured in
    every bucket with the least total time (else the heuristic of the largest bucket)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for e in entries:
        for prov in e["configs"]:
            space = space_for(e["op"], prov)
            if space is not None and space.reduction_params:
                groups.setdefault((e["op"], prov, e["dtype"], tuple(e["shape"])), []).append(e)
    for (_op, prov, _dt, _shape), es in groups.items():
        common: dict[str, float] | None = None
        for e in es:
            rows = {
                k: v["median_us"]
                for k, v in e["measured"].get(prov, {}).items()
                if isinstance(v, dict) and k != "heuristic"
            }
            common = (
                rows if common is None else {k: common[k] + rows[k] for k in common if k in rows}
            )
        if common:
            key = min(common, key=lambda k: common[k])
            cfg = {k: int(v) for k, v in (kv.split("=") for kv in key.split(","))}
        else:
            cfg = max(es, key=lambda e: e["tokens"])["configs"][prov]
        for e in es:
            e["configs"][prov] = dict(cfg)


def run(opts: Options, *, interruptions: Any = None) -> dict[str, Any]:
    """Search, write the table to ``opts.out`` (default: the user cache dir), and return
    the document (``doc["path"]``: where it was written, ``None`` when nothing was).

    Where the table goes is checked first (`opcore.tuning.table.out_problem`: a
    `ValueError` before anything is measured). An interrupt (a `KeyboardInterrupt`, or the
    exception a caller's signal handler raises, with a ``signal_name``) stops the search:
    the buckets measured so far are written, marked incomplete (``search.complete`` false,
    ``search.interrupted`` the signal's name, ``search.not_measured`` the buckets left),
    and the document is returned; when none was measured, nothing is written.

    ``interruptions``: the caller's signal handler state, if it has one: ``signal_name``
    (the first signal received, or ``None``) and ``raising`` (whether the handler raises).
    The search also stops before the next bucket when a signal came but its exception was
    swallowed, and sets ``raising`` to False once it turns to writing the table, so a
    signal then is only recorded and the table is written whole."""
    from opcore.bench import cases
    from opcore.ir import get_op
    from opcore.platforms import get_current_platform
    from opcore.platforms.kernels import ensure_kernels_loaded

    ensure_kernels_loaded()
    for name in opts.ops:
        get_op(name)  # an unknown op is an error naming the registered ones
        if key_function(name) is None:
            raise ValueError(
                f"op {name!r} has no shape bucket key to tune by (register one with "
                f"opcore.tuning.register_bucket_key)"
            )
    platform = get_current_platform()
    device = platform.device()
    environment = runtime.environment()
    out = opts.out or str(runtime.user_cache_dir() / _file_name(environment))
    problem = table.out_problem(out)
    if problem is not None:  # before measuring: a run must not be lost to where it goes
        raise ValueError(f"the table cannot be written to {out!r}: {problem}")
    timer = Timer(platform, device, opts.rep_ms)
    plan = [
        (name, hidden, tokens, dtype)
        for name in opts.ops
        for hidden in opts.hidden
        for dtype in opts.dtypes
        for tokens in opts.tokens
    ]
    start = time.perf_counter()
    end = start + opts.budget_s
    entries: list[dict[str, Any]] = []
    skipped: list[str] = []
    interrupted: str | None = None
    reached = 0  # plan items decided (measured or skipped for the budget)
    # Time the table's own effect out: candidates run with the heuristic as incumbent.
    with _tuning_off():
        try:
            for i, (name, hidden, tokens, dtype) in enumerate(plan):
                if interruptions is not None and interruptions.signal_name:
                    interrupted = interruptions.signal_name  # its exception was swallowed
                    break
                now = time.perf_counter()
                if now > end:
                    skipped.append(_label(name, tokens, hidden, dtype))
                    reached = i + 1
                    continue
                share = (end - now) / (len(plan) - i)
                op = get_op(name)
                case = cases.build(name, tokens, hidden, dtype, device, quick=opts.quick)
                entry = tune_bucket(op, case.args, timer, now + share, opts)
                entry["case"] = case.key
                entries.append(entry)
                reached = i + 1
                opts.log(_line(entry))
                if device.type != "cpu":
                    platform.empty_cache()
        except KeyboardInterrupt as exc:
            if interruptions is not None:
                interruptions.raising = False
            interrupted = getattr(exc, "signal_name", None) or "SIGINT"
        finally:
            if interruptions is not None:
                interruptions.raising = False  # from here on the table is written whole
    if "batch_invariant" in opts.properties:
        _hold_reductions(entries)
    spent = time.perf_counter() - start
    idents: dict[str, dict[str, str]] = {}
    for e in entries:
        op = get_op(e["op"])
        for prov in {*e["order"], *e["configs"]}:
            idents.setdefault(e["op"], {})[prov] = op.impls[prov].identity_hash()
    not_measured = (
        [_label(n, t, h, d) for n, h, t, d in plan[reached:]] if interrupted is not None else []
    )
    doc: dict[str, Any] = {
        "format": table.FORMAT,
        "version": table.VERSION,
        "environment": environment,
        "properties": sorted(opts.properties),
        "providers": idents,
        "search": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "budget_s": opts.budget_s,
            "spent_s": round(spent, 1),
            "timer": timer.kind,
            "min_gain": opts.min_gain,
            "rep_ms": opts.rep_ms,
            "ops": list(opts.ops),
            "tokens": list(opts.tokens),
            "hidden": list(opts.hidden),
            "dtypes": [str(d).removeprefix("torch.") for d in opts.dtypes],
            "quick": opts.quick,
            "skipped_for_budget": skipped,
            # False when a signal stopped the search: the entries are the buckets measured
            # before it (each whole), `not_measured` the ones it never reached.
            "complete": interrupted is None,
            "interrupted": interrupted,
            "not_measured": not_measured,
        },
        "entries": entries,
    }
    written = None
    if entries or interrupted is None:  # an interrupted run with nothing measured: none
        table.dump(doc, out)
        written = out
    doc["path"] = written
    return doc


def _label(name: str, tokens: int, hidden: int, dtype: Any) -> str:
    return f"{name} T={tokens} H={hidden} {str(dtype).removeprefix('torch.')}"


@contextlib.contextmanager
def _tuning_off() -> Any:
    """No table applies while the search runs (every incumbent is the heuristic)."""
    import os

    old = os.environ.get(runtime.ENV)
    os.environ[runtime.ENV] = "off"
    runtime.reload()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(runtime.ENV, None)
        else:
            os.environ[runtime.ENV] = old
        runtime.reload()


def _file_name(env: dict[str, Any]) -> str:
    text = f"{env.get('platform')}-{env.get('device')}-{env.get('capability')}"
    slug = "".join(c if c.isalnum() or c in "-." else "_" for c in text)
    return f"{slug}.json"


def _line(e: dict[str, Any]) -> str:
    head = e["order"][0] if e["order"] else "-"
    inc = e["heuristic"].get(e["incumbent"])
    win = e["best"].get(head)
    gain = ""
    if inc and win:
        gain = f" {inc['median_us']:.2f} -> {win['median_us']:.2f} us ({win['timer']})"
    tried = sum(len([k for k in m if k != "(budget)"]) for m in e["measured"].values())
    return (
        f"{e['op']:<24} {e['dtype']:<9} T={e['tokens']:<6} shape={e['shape']}: "
        f"{head} {e['configs'].get(head, '')}{gain}; {tried} timed, "
        f"{len(e['rejected'])} rejected"
    )
