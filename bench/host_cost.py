"""What an eager op call costs on the host, next to what it costs on the device.

For every op with a Triton provider (on the CPU: the same ops with the native provider),
one process times, interleaved round by round:

- ``opcore``: the op as a user calls it (``ops.<op>(*args)``, default priority, the
  shipped tuning table);
- ``in_block``: the same inside a ``with ops.<op>.set_priority([provider])`` block opened
  once; ``block_per_call``: a block entered and left around every call; ``block_only``: the
  block's entry and exit alone;
- ``bound``: the callable dispatch keeps for this call's signature, called directly (for
  a Triton provider, its bound replay: the floor of a launch through opcore);
- ``provider``: the chosen provider's function called directly (its full launcher);
- ``torch``: torch eager (``F.rms_norm``, ``F.silu(g) * u``, else the native function);
- ``compile``: ``torch.compile`` of the native function; ``liger`` and ``flaggems`` where
  they have the op (`opcore.bench.baselines`);
- for attention, ``attention_eager`` / ``attention_graph``: the backend's decode forward,
  eager and replayed from a graph.

Host time per call is the wall time of ``--calls`` back-to-back calls over their number,
with the device synchronised before and after (so it is the host's time where the calls
are short on the device, the case here). Device time per call is a graph replay of the
calls where the platform has graphs (`opcore.bench.timing.graph_samples_us`). Each figure
is the median over ``--rounds`` rounds, with the quartiles.

    python bench/host_cost.py [--tokens 32] [--ops a,b] [--no-compile] [--json F] [--markdown F]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import platform as host_platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import opcore
from opcore.bench import baselines, cases, timing
from opcore.bench.report import write_json
from opcore.ir import ops
from opcore.kernels import TRITON_OPS
from opcore.platforms import get_current_platform

HIDDEN = 4096
INTERMEDIATE = 14336


# The fp8 ops' arguments from (x, weight, residual, gated input, static scale).
FP8_ARGS = {
    "scaled_fp8_quant": lambda x, w, r, g, s: (x, s),
    "dynamic_per_token_scaled_fp8_quant": lambda x, w, r, g, s: (x,),
    "per_token_group_quant_fp8": lambda x, w, r, g, s: (x, 128),
    "rms_norm_static_fp8_quant": lambda x, w, r, g, s: (x, w, 1e-6, s),
    "fused_add_rms_norm_static_fp8_quant": lambda x, w, r, g, s: (x, r, w, 1e-6, s),
    "rms_norm_dynamic_per_token_quant": lambda x, w, r, g, s: (x, w, 1e-6),
    "silu_and_mul_fp8_quant": lambda x, w, r, g, s: (g, s),
    "silu_and_mul_per_token_group_fp8_quant": lambda x, w, r, g, s: (g, 128),
}


def fp8_args(op: str, tokens: int, dtype: torch.dtype, device) -> tuple:
    """Arguments of the fp8 ops at ``tokens`` x `HIDDEN` (intermediate `INTERMEDIATE`)."""
    g = torch.Generator(device="cpu").manual_seed(tokens)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    scale = torch.tensor([0.05], dtype=torch.float32, device=device)
    x, w, r = randn(tokens, HIDDEN), randn(HIDDEN), randn(tokens, HIDDEN)
    return FP8_ARGS[op](x, w, r, randn(tokens, 2 * INTERMEDIATE), scale)


def torch_eager(op_name: str, args: tuple) -> Callable[[], object]:
    """What a user writes in plain torch for the op (the native function elsewhere)."""
    F = torch.nn.functional
    if op_name == "rms_norm":
        x, w, eps = args
        return functools.partial(F.rms_norm, x, (x.shape[-1],), w, eps)
    if op_name == "silu_and_mul":
        (x,) = args
        d = x.shape[-1] // 2
        return lambda: F.silu(x[..., :d]) * x[..., d:]
    return functools.partial(getattr(ops, op_name).native, *args)


def host_round_us(fn: Callable[[], object], calls: int, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    sync()
    return (t1 - t0) * 1e6 / calls


def quartiles(samples: list[float]) -> dict[str, float]:
    s = timing.spread(samples)
    return {"median": s.median_us, "p25": s.p25_us, "p75": s.p75_us}


def block_fns(op, provider: str, args: tuple) -> dict[str, Callable[[], object]]:
    def block_per_call():
        with op.set_priority([provider]):
            return op(*args)

    def block_only():
        with op.set_priority([provider]):
            pass

    return {"block_per_call": block_per_call, "block_only": block_only}


def variants(op_name: str, args: tuple, with_compile: bool) -> tuple[dict, dict, str]:
    """``({name: fn}, {name: why left out}, provider)`` for one op's arguments."""
    op = getattr(ops, op_name)
    op(*args)
    op(*args)  # the second call is served by what the signature bound
    provider = op.dispatch(*args).provider
    fns: dict[str, Callable[[], object]] = {"opcore": functools.partial(op, *args)}
    skipped: dict[str, str] = {}
    route = op.route()
    bound = next(iter(route.bound.values()), None) if len(route.bound) == 1 else None
    if bound is None:
        skipped["bound"] = "no single bound callable for this signature"
    else:
        fns["bound"] = functools.partial(bound, *args)
    fns["provider"] = functools.partial(op.impls[provider].functional, *args)
    fns.update(block_fns(op, provider, args))
    fns["torch"] = torch_eager(op_name, args)
    wanted = {"liger", "flaggems"} | ({"compile"} if with_compile else set())
    if op_name in cases_ops():
        case = cases.Case(op_name, args[0].shape[0], HIDDEN, "", args[0].dtype, args, 0)
        peers, why = baselines.providers(case, wanted)
        for name in ("compile", "liger", "flaggems"):
            if name in peers:
                fns[name] = peers[name]
            elif name in why:
                skipped[name] = why[name]
    elif with_compile:
        compiled = torch.compile(op.native, dynamic=False)
        fns["compile"] = functools.partial(compiled, *args)
    return fns, skipped, provider


@functools.cache
def cases_ops() -> frozenset[str]:
    """The ops `opcore.bench.cases` builds arguments for."""
    return frozenset(
        (
            "rms_norm",
            "fused_add_rms_norm",
            "silu_and_mul",
            "gelu_and_mul",
            "rotary_embedding",
            "split_qkv_rmsnorm_rope",
        )
    )


def build_args(op_name: str, tokens: int, dtype: torch.dtype, device) -> tuple:
    if op_name in cases_ops():
        return cases.build(op_name, tokens, HIDDEN, dtype, device).args
    return fp8_args(op_name, tokens, dtype, device)


def measure(
    fns: dict, plat, rounds: int, calls: int, graphs: bool, blocks: dict | None = None
) -> dict[str, Any]:
    """Host (and graph-replay device) time per call of each of ``fns``; ``blocks``: for
    some names, a context manager factory whose block is open while that one runs."""
    blocks = blocks or {}
    sync = plat.synchronize
    for name, fn in fns.items():  # warm: compile, JIT, bind
        with blocks.get(name, contextlib.nullcontext)():
            for _ in range(3):
                fn()
    host: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        names = list(fns) if r % 2 == 0 else list(reversed(fns))
        for name in names:
            with blocks.get(name, contextlib.nullcontext)():
                host[name].append(host_round_us(fns[name], calls, sync))
    out: dict[str, Any] = {name: {"host_us": quartiles(s)} for name, s in host.items()}
    if graphs:
        for name, fn in fns.items():
            if name in ("block_only",):
                continue
            try:
                with blocks.get(name, contextlib.nullcontext)():
                    samples = timing.graph_samples_us(fn, plat, rep_ms=20)
            except Exception as exc:  # a peer that cannot be captured: say why
                out[name]["device_us"] = f"not captured: {type(exc).__name__}"
                continue
            if samples is not None:
                out[name]["device_us"] = statistics.median(samples)
    return out


def attention_rows(plat, device, dtype, rounds: int, calls: int) -> list[dict[str, Any]]:
    from opcore.attention.bench import build_decode_batch
    from opcore.attention.selector import backend_class

    rows = []
    for name in ("TRITON_PAGED", "TORCH_NATIVE"):
        try:
            cls = backend_class(name)
        except Exception as exc:
            rows.append({"backend": name, "error": str(exc)[:200]})
            continue
        impl = cls(32, 128, 8, 128**-0.5)
        for batch in (1, 16):
            try:
                cache, _table, query, md = build_decode_batch(
                    batch, 1024, kv_heads=8, heads=32, head_size=128, block_size=16,
                    dtype=dtype, device=device, backend_cls=cls,
                )  # fmt: skip
                fn = functools.partial(impl.forward, query, cache, md)
                fn()
                host = [host_round_us(fn, calls, plat.synchronize) for _ in range(rounds)]
                graph = timing.graph_samples_us(fn, plat, rep_ms=20)
                rows.append(
                    {
                        "backend": name,
                        "batch": batch,
                        "context": 1024,
                        "eager_host_us": quartiles(host),
                        "graph_us": None if graph is None else statistics.median(graph),
                    }
                )
            except Exception as exc:  # one backend's failure must not lose the others
                rows.append({"backend": name, "batch": batch, "error": f"{exc!r}"[:300]})
    return rows


def do_bench_rows(tokens: int, dtype: torch.dtype, device) -> list[dict[str, Any]]:
    """``triton.testing.do_bench`` (device time per call, caches flushed) of ``rms_norm`` at
    ``tokens`` x `HIDDEN`, as the user calls it, inside a `set_priority` block opened once,
    with a block per call, and the bound replay and the provider alone (the kernel)."""
    try:
        from triton.testing import do_bench
    except Exception as exc:
        return [{"error": f"triton.testing unavailable: {exc!r}"[:200]}]
    op = ops.rms_norm
    args = build_args("rms_norm", tokens, dtype, device)
    op(*args)
    op(*args)
    provider = op.dispatch(*args).provider
    bound = list(op.route().bound.values())
    fns = {
        "provider": functools.partial(op.impls[provider].functional, *args),
        "bound": functools.partial(bound[-1], *args) if bound else None,
        "opcore": functools.partial(op, *args),
    }
    rows = []
    for name, fn in fns.items():
        if fn is not None:
            rows.append({"variant": name, "us": 1e3 * do_bench(fn, warmup=50, rep=200)})
    with op.set_priority([provider]):
        op(*args)
        rows.append({"variant": "in_block", "us": 1e3 * do_bench(lambda: op(*args), rep=200)})

    def per_call():
        with op.set_priority([provider]):
            op(*args)

    rows.append({"variant": "block_per_call", "us": 1e3 * do_bench(per_call, rep=200)})
    base = rows[0]["us"]
    for r in rows:
        r["vs_provider"] = r["us"] / base
    return rows


def fmt(v: Any) -> str:
    if isinstance(v, dict):
        return f"{v['median']:.2f} [{v['p25']:.2f}-{v['p75']:.2f}]"
    if isinstance(v, float):
        return f"{v:.2f}"
    return "" if v is None else str(v)


COLUMNS = (
    "opcore",
    "in_block",
    "bound",
    "provider",
    "torch",
    "compile",
    "liger",
    "flaggems",
    "block_per_call",
    "block_only",
)


def markdown(doc: dict[str, Any]) -> str:
    m = doc["meta"]
    lines = [
        f"# Host cost per call ({m['device']}, {m['date']})",
        "",
        f"torch {m['torch']}, triton {m['triton']}, opcore {m['opcore']}, Python {m['python']}, "
        f"{m['tokens']} tokens, {m['dtype']}, {m['calls']} calls x {m['rounds']} rounds; "
        "host us per call: median [p25-p75]; device us per call from graph replay.",
        "",
        "| op | provider | " + " | ".join(COLUMNS) + " | device opcore | device torch |",
        "|---|---|" + "---|" * (len(COLUMNS) + 2),
    ]
    for row in doc["ops"]:
        r = row["results"]
        cells = [fmt(r.get(c, {}).get("host_us")) for c in COLUMNS]
        dev = [fmt(r.get(c, {}).get("device_us")) for c in ("opcore", "torch")]
        lines.append(f"| {row['op']} | {row['provider']} | " + " | ".join(cells + dev) + " |")
    lines += ["", "| attention | batch | eager host us | graph us |", "|---|---|---|---|"]
    for a in doc["attention"]:
        if "error" in a:
            lines.append(f"| {a['backend']} | {a.get('batch', '')} | {a['error']} | |")
        else:
            lines.append(
                f"| {a['backend']} | {a['batch']} | {fmt(a['eager_host_us'])} | "
                f"{fmt(a['graph_us'])} |"
            )
    if doc.get("do_bench"):
        lines += [
            "",
            f"do_bench of rms_norm at {doc['do_bench_tokens']} x {HIDDEN} (device us per call):",
            "",
            "| variant | us | vs provider |",
            "|---|---|---|",
        ]
        for r in doc["do_bench"]:
            if "error" in r:
                lines.append(f"| {r['error']} | | |")
            else:
                lines.append(f"| {r['variant']} | {r['us']:.2f} | {r['vs_provider']:.3f} |")
    skipped = [f"- {row['op']}: {k}: {v}" for row in doc["ops"] for k, v in row["skipped"].items()]
    if skipped:
        lines += ["", "Left out:", *skipped]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--ops", default=",".join(TRITON_OPS))
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--no-attention", action="store_true")
    p.add_argument(
        "--do-bench-tokens",
        type=int,
        default=4096,
        help="tokens of the do_bench rows of rms_norm on a device (0: none)",
    )
    p.add_argument("--json")
    p.add_argument("--markdown")
    a = p.parse_args(argv)
    if a.tokens < 1 or a.calls < 1 or a.rounds < 1:
        p.error("--tokens, --calls and --rounds must be at least 1")
    names = [n for n in a.ops.split(",") if n]
    unknown = [n for n in names if n not in TRITON_OPS]
    if unknown:
        p.error(f"unknown --ops {', '.join(unknown)}; choose from {', '.join(TRITON_OPS)}")
    plat = get_current_platform()
    device = plat.device()
    dtype = torch.bfloat16 if device.type != "cpu" else torch.float32
    graphs = plat.timing_event() is not None
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    doc: dict[str, Any] = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": plat.get_device_name(0)
            if device.type != "cpu"
            else host_platform.processor() or "cpu",
            "host": host_platform.node(),
            "torch": torch.__version__,
            "triton": triton_version,
            "opcore": opcore.__version__,
            "python": sys.version.split()[0],
            "tokens": a.tokens,
            "dtype": str(dtype).removeprefix("torch."),
            "calls": a.calls,
            "rounds": a.rounds,
        },
        "ops": [],
        "attention": [],
    }
    for name in names:
        if name not in cases_ops() and name not in FP8_ARGS:
            why = {"all": "no argument builder in host_cost.py"}
            doc["ops"].append({"op": name, "provider": "", "results": {}, "skipped": why})
            continue
        args = build_args(name, a.tokens, dtype, device)
        fns, skipped, provider = variants(name, args, not a.no_compile)
        op = getattr(ops, name)
        fns["in_block"] = functools.partial(op, *args)
        block = functools.partial(op.set_priority, [provider])
        results = measure(fns, plat, a.rounds, a.calls, graphs, {"in_block": block})
        doc["ops"].append({"op": name, "provider": provider, "results": results,
                           "skipped": skipped})  # fmt: skip
        r = results
        print(
            f"{name:40s} {provider:8s} opcore {fmt(r['opcore']['host_us'])}  "
            f"bound {fmt(r.get('bound', {}).get('host_us'))}  "
            f"torch {fmt(r['torch']['host_us'])}",
            flush=True,
        )
    if device.type != "cpu" and a.do_bench_tokens:
        doc["do_bench_tokens"] = a.do_bench_tokens
        doc["do_bench"] = do_bench_rows(a.do_bench_tokens, dtype, device)
    if not a.no_attention:
        doc["attention"] = attention_rows(plat, device, dtype, a.rounds, a.calls // 4 or 1)
    text = markdown(doc)
    print(text)
    if a.json:
        write_json(doc, a.json)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
