"""Collectives benchmark: all-reduce bus bandwidth and the fused all-reduce + add + RMSNorm,
on N local ranks (one device each) through `opcore.distributed.run_ranks`.

1. All-reduce, 1 KB to 256 MB (powers of 4, bf16): ``torch.distributed.all_reduce`` alone
   (in place), the platform's `Communicator.all_reduce` (out of place: a copy, then the
   same call), the ``all_reduce`` op (validation and dispatch on top), and the op's
   ``maybe_inplace`` with the ``in_place`` provider (the caller's buffer reduced in
   place). Bus bandwidth ``2 (n - 1) / n * bytes / time``, the convention that makes it
   comparable across world sizes.
2. ``fused_all_reduce_add_rms_norm`` (default overload, and ``maybe_inplace`` with the
   ``in_place`` provider) against the unfused sequence (``all_reduce`` op, then
   ``fused_add_rms_norm`` op) and against ``torch.distributed.all_reduce`` + the
   ``fused_add_rms_norm`` op, at decode sizes (``--tokens``, hidden ``--hidden``) and one
   prefill size (``--prefill`` tokens); eager, and replayed from a device graph where the
   communicator declares ``capture_safe`` and the platform captures graphs.

Times are per call, the slowest rank's, from device timing events around a loop (the
host clock around ``synchronize`` where the platform has no events).

Run: ``python bench/collectives.py --world-size 2 --out DIR`` (``--small`` for a quick run
of the plumbing on the CPU with gloo). Writes ``collectives.json`` / ``collectives.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

from opcore.bench.report import write_json

KB, MB = 1024, 1024 * 1024


def _timer(platform, comm, fn, iters: int, warmup: int) -> float:
    """Microseconds per call of ``fn`` on this rank, the ranks starting the timed loop
    together (a barrier after the warm-up)."""
    from opcore.bench.timing import loop_us

    return loop_us(fn, platform, iters=iters, warmup=warmup, ready=comm.barrier)


def _graph(platform, comm, fn):
    """``fn`` captured into a device graph (its replay), or None where that is not
    possible here (not declared capture-safe, no graphs, or the capture failed)."""
    if not comm.capture_safe:
        return None, "communicator not declared capture_safe"
    try:
        replay = platform.capture_graph(fn)
    except Exception as exc:  # recorded in the results: a capture failure is a finding
        return None, f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    if replay is None:
        return None, "platform has no graphs"
    return replay, ""


def _iters(nbytes: int, small: bool) -> tuple[int, int]:
    if small:
        return 3, 1
    return max(10, min(200, int(4e9 / max(nbytes, 1)))), 5


def rank_body(comm, cfg: dict) -> dict:
    import torch.distributed as dist

    from opcore.ir import ops
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    dev, dtype = comm.device, getattr(torch, cfg["dtype"])
    esize = torch.tensor([], dtype=dtype).element_size()
    n = comm.world_size
    out: dict = {"allreduce": [], "fused": [], "communicator": repr(comm)}
    g = torch.Generator(device="cpu").manual_seed(1000 + comm.rank)

    for nbytes in cfg["sizes"]:
        numel = max(1, nbytes // esize)
        x = torch.randn(numel, generator=g).to(dev, dtype)
        iters, warm = _iters(nbytes, cfg["small"])
        row = {"bytes": numel * esize}
        row["torch_us"] = _timer(
            platform, comm, lambda x=x: dist.all_reduce(x, group=comm.group), iters, warm
        )
        row["communicator_us"] = _timer(platform, comm, lambda x=x: comm.all_reduce(x), iters, warm)
        row["op_us"] = _timer(platform, comm, lambda x=x: ops.all_reduce(x, "world"), iters, warm)
        with ops.all_reduce.set_priority(["in_place"]):
            row["op_inplace_us"] = _timer(
                platform, comm, lambda x=x: ops.all_reduce.maybe_inplace(x, "world"), iters, warm
            )
        factor = 2 * (n - 1) / n if n > 1 else 1.0
        for k in ("torch", "communicator", "op", "op_inplace"):
            row[f"{k}_busbw_gbs"] = factor * row["bytes"] / (row[f"{k}_us"] * 1e-6) / 1e9
        out["allreduce"].append(row)
        del x

    hidden, eps = cfg["hidden"], 1e-6
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dev, dtype)
    for tokens in [*cfg["tokens"], *([cfg["prefill"]] if cfg["prefill"] else [])]:
        x = torch.randn(tokens, hidden, generator=g).to(dev, dtype)
        res = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(7)).to(dev, dtype)
        iters, warm = _iters(tokens * hidden * esize, cfg["small"])

        def unfused(x=x, res=res):
            return ops.fused_add_rms_norm(ops.all_reduce(x, "world"), res, w, eps)

        def fused(x=x, res=res):
            return ops.fused_all_reduce_add_rms_norm(x, res, w, eps, "world")

        def fused_inplace(x=x, res=res):
            # the caller donates x and res (they are overwritten; timing only); run inside
            # the in_place priority block below
            return ops.fused_all_reduce_add_rms_norm.maybe_inplace(x, res, w, eps, "world")

        def torch_then_norm(x=x, res=res):
            y = x.clone()
            dist.all_reduce(y, group=comm.group)
            return ops.fused_add_rms_norm(y, res, w, eps)

        a, b = fused(), unfused()
        row = {
            "tokens": tokens,
            "hidden": hidden,
            "provider": ops.fused_all_reduce_add_rms_norm.dispatch(
                x, res, w, eps, "world"
            ).provider,
            "fused_equals_unfused": bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])),
        }
        variants = (
            ("fused", fused),
            ("fused_inplace", fused_inplace),
            ("unfused", unfused),
            ("torch_dist", torch_then_norm),
        )
        for name, fn in variants:
            # one priority block around the whole measurement: entering it per call would
            # add its own cost to the eager time
            block = (
                ops.fused_all_reduce_add_rms_norm.set_priority(["in_place"])
                if name == "fused_inplace"
                else contextlib.nullcontext()
            )
            with block:
                row[f"{name}_eager_us"] = _timer(platform, comm, fn, iters, warm)
                replay, why = _graph(platform, comm, fn)
                row[f"{name}_graph_us"] = (
                    _timer(platform, comm, replay, iters, warm) if replay is not None else None
                )
            if why:
                row["graph_note"] = why
        out["fused"].append(row)
    return out


def _slowest(per_rank: list[dict]) -> dict:
    """Per row, the largest time over the ranks (a collective ends with its slowest rank)."""
    merged = json.loads(json.dumps(per_rank[0]))
    for part in ("allreduce", "fused"):
        for i, row in enumerate(merged[part]):
            for key, value in row.items():
                if key.endswith("_us") and value is not None:
                    row[key] = max(r[part][i][key] or 0.0 for r in per_rank)
            if part == "allreduce":
                n = len(per_rank)
                factor = 2 * (n - 1) / n if n > 1 else 1.0
                for k in ("torch", "communicator", "op", "op_inplace"):
                    row[f"{k}_busbw_gbs"] = factor * row["bytes"] / (row[f"{k}_us"] * 1e-6) / 1e9
    return merged


def _size(nbytes: int) -> str:
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


def _markdown(result: dict, env: dict) -> str:
    lines = [
        f"# collectives: world size {env['world_size']}, {env['dtype']}",
        "",
        ", ".join(f"{k}: {v}" for k, v in env.items()),
        "",
        "## all-reduce (bus bandwidth GB/s; time µs, slowest rank)",
        "",
        "| size | torch.distributed µs | GB/s | Communicator µs | GB/s | all_reduce op µs | GB/s "
        "| op maybe_inplace µs | GB/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["allreduce"]:
        lines.append(
            f"| {_size(r['bytes'])} | {r['torch_us']:.1f} | {r['torch_busbw_gbs']:.1f} | "
            f"{r['communicator_us']:.1f} | {r['communicator_busbw_gbs']:.1f} | {r['op_us']:.1f} | "
            f"{r['op_busbw_gbs']:.1f} | {r['op_inplace_us']:.1f} | "
            f"{r['op_inplace_busbw_gbs']:.1f} |"
        )
    lines += [
        "",
        "## fused all-reduce + add + RMSNorm (µs per call, slowest rank)",
        "",
        "fused: `fused_all_reduce_add_rms_norm`; in place: its `maybe_inplace` with the "
        "`in_place` provider (x and residual donated); unfused: `all_reduce` op then "
        "`fused_add_rms_norm` op; torch.distributed: copy + `torch.distributed.all_reduce` then "
        "`fused_add_rms_norm` op.",
        "",
        "| tokens | provider | fused eager | in place eager | unfused eager | "
        "torch.distributed eager | fused graph | in place graph | unfused graph | "
        "torch.distributed graph | fused == unfused |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def f(v):
        return "" if v is None else f"{v:.1f}"

    for r in result["fused"]:
        lines.append(
            f"| {r['tokens']} | {r['provider']} | {f(r['fused_eager_us'])} | "
            f"{f(r['fused_inplace_eager_us'])} | "
            f"{f(r['unfused_eager_us'])} | {f(r['torch_dist_eager_us'])} | "
            f"{f(r['fused_graph_us'])} | {f(r['fused_inplace_graph_us'])} | "
            f"{f(r['unfused_graph_us'])} | "
            f"{f(r['torch_dist_graph_us'])} | {'bitwise' if r['fused_equals_unfused'] else 'no'} |"
        )
    notes = sorted({r["graph_note"] for r in result["fused"] if r.get("graph_note")})
    if notes:
        lines += ["", "graphs: " + "; ".join(notes)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--prefill", type=int, default=8192, help="prefill tokens (0: none)")
    ap.add_argument("--max-bytes", type=int, default=256 * MB)
    ap.add_argument("--small", action="store_true", help="few sizes and iterations (plumbing)")
    ap.add_argument("--timeout", type=float, default=240.0, help="bound on the whole run, s")
    ap.add_argument("--out", default=None, help="directory for collectives.json / .md")
    args = ap.parse_args(argv)

    from opcore.distributed import check, run_ranks
    from opcore.platforms import get_current_platform

    sizes, s = [], KB
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 4
    cfg = {
        "sizes": sizes,
        "dtype": args.dtype,
        "hidden": args.hidden,
        "tokens": [int(t) for t in args.tokens.split(",") if t],
        "prefill": args.prefill,
        "small": args.small,
    }
    platform = get_current_platform()
    outcomes = run_ranks(
        rank_body,
        args.world_size,
        args=(cfg,),
        timeout_s=args.timeout,
        comm_timeout_s=min(120.0, args.timeout),
        env={"OPCORE_PLATFORM": platform.name},
    )
    result = _slowest(check(outcomes))
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "platform": platform.name,
        "backend": platform.dist_backend,
        "world_size": args.world_size,
        "dtype": args.dtype,
        "device": platform.get_device_name(0),
        "torch": torch.__version__,
        "communicator": result["communicator"],
    }
    text = _markdown(result, env)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_json({"environment": env, **result}, os.path.join(args.out, "collectives.json"))
        with open(os.path.join(args.out, "collectives.md"), "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
