"""Tensor-parallel decode step: the decode_step.py decoder (Llama-3-8B layer shapes, 8
layers, bf16) built from opcore's tensor-parallel layers, run on ``--tp`` ranks, one
device each, through `opcore.distributed.run_ranks`.

Each layer: QKV `ColumnParallelLinear` (heads split across ranks), rotary on the local q/k
heads, attention stand-in (SDPA of the new tokens over a fixed KV context, local heads),
output `RowParallelLinear` without its reduction, then ``fused_all_reduce_add_rms_norm``
(all-reduce + residual add + RMSNorm); gate/up `ColumnParallelLinear`, SiLU-and-mul, down
`RowParallelLinear` without its reduction, and the next layer's
``fused_all_reduce_add_rms_norm``. The fused op is called with ``maybe_inplace`` and the
``in_place`` provider: the all-reduce writes into the projection's output, the norm into
it and the residual. With ``--tp 1`` the same code runs with no collective
(``fused_add_rms_norm.maybe_inplace`` in its place). Every rank draws the full weights
from one seed and keeps its shard, so the outputs of different ``--tp`` are comparable.

Times: per step, the slowest rank, eager (device events around a loop) and replayed from
a device graph where the communicator declares ``capture_safe`` (always for ``--tp 1``).
The relative difference of each run's output from the first ``--tp``'s is reported.

Run: ``python bench/tp_decode_step.py --tp 1,2 [--batch 1,8,32] [--out DIR]``;
``--small`` shrinks the model for a quick run of the plumbing on the CPU (gloo).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

from opcore.bench.report import write_json

FULL = {"hidden": 4096, "layers": 8, "heads": 32, "kv_heads": 8, "head": 128, "inter": 14336}
SMALL = {"hidden": 256, "layers": 2, "heads": 8, "kv_heads": 4, "head": 32, "inter": 512}


class TPDecoder:
    """The decoder's shards on this rank and one decode step over ``batch`` tokens."""

    def __init__(self, comm, shape: dict, batch: int, context: int, dtype, group="world"):
        from opcore.layers import (
            ColumnParallelLinear,
            RotaryEmbedding,
            RowParallelLinear,
            SiluAndMul,
        )

        dev, tp = comm.device, comm.world_size
        self.group, self.tp, self.batch, self.eps = group, tp, batch, 1e-5
        h, nh, nkv, d, inter = (shape[k] for k in ("hidden", "heads", "kv_heads", "head", "inter"))
        self.local_heads, self.local_kv, self.d = nh // tp, nkv // tp, d
        g = torch.Generator(device=dev).manual_seed(0)

        def w(*s, scale):  # the full weight, drawn on the device from the shared seed
            return (torch.randn(*s, generator=g, device=dev) * scale).to(dtype)

        def col(out, parts, full):
            m = ColumnParallelLinear(
                h, out, group=group, output_sizes=parts, dtype=dtype, device=dev
            )
            m.load_full_weight(full)
            return m

        def row(inp, full):
            m = RowParallelLinear(
                inp, h, group=group, reduce_results=False, dtype=dtype, device=dev
            )
            m.load_full_weight(full)
            return m

        kvc = lambda: w(batch, nkv, context, d, scale=1.0)  # noqa: E731
        self.layers = []
        for _ in range(shape["layers"]):
            layer = {
                "in_norm": w(h, scale=0.1) + 1,
                "qkv": col(
                    (nh + 2 * nkv) * d,
                    [nh * d, nkv * d, nkv * d],
                    w((nh + 2 * nkv) * d, h, scale=h**-0.5),
                ),
                "o": row(nh * d, w(h, nh * d, scale=h**-0.5)),
                "post_norm": w(h, scale=0.1) + 1,
                "gate_up": col(2 * inter, [inter, inter], w(2 * inter, h, scale=h**-0.5)),
                "down": row(inter, w(h, inter, scale=inter**-0.5)),
            }
            kv0, kv1 = comm.rank * self.local_kv, (comm.rank + 1) * self.local_kv
            layer["k_ctx"] = kvc()[:, kv0:kv1].contiguous()
            layer["v_ctx"] = kvc()[:, kv0:kv1].contiguous()
            self.layers.append(layer)
        self.final_norm = w(h, scale=0.1) + 1
        self.rope = RotaryEmbedding(
            d, d, max_position=context + 64, rope_theta=500000.0, is_neox=True
        ).to(dev)
        self.act = SiluAndMul()
        self.positions = torch.full((batch,), context, dtype=torch.int64, device=dev)
        self.x = w(batch, h, scale=1.0)

    def _reduce_add_norm(self, partial, residual, weight):
        from opcore.ir import ops

        # partial and residual are this step's own buffers: donated (maybe_inplace)
        if self.tp == 1:  # a sum over one rank is the tensor itself
            return ops.fused_add_rms_norm.maybe_inplace(partial, residual, weight, self.eps)
        return ops.fused_all_reduce_add_rms_norm.maybe_inplace(
            partial, residual, weight, self.eps, self.group
        )

    def step(self) -> torch.Tensor:
        b, nq, nkv, d = self.batch, self.local_heads, self.local_kv, self.d
        partial, residual = self.x.clone(), torch.zeros_like(self.x)
        # layer 0's input is whole on every rank: only rank 0 feeds it into the first
        # reduction, so the sum over ranks is x once
        if self.tp > 1 and torch.distributed.get_rank() != 0:
            partial = torch.zeros_like(self.x)
        for p in self.layers:
            h, residual = self._reduce_add_norm(partial, residual, p["in_norm"])
            qkv = p["qkv"](h)
            q, k = qkv[:, : nq * d], qkv[:, nq * d : (nq + nkv) * d]
            q, k = self.rope(self.positions, q, k)
            attn = F.scaled_dot_product_attention(
                q.reshape(b, nq, 1, d), p["k_ctx"], p["v_ctx"], enable_gqa=True
            )
            h, residual = self._reduce_add_norm(
                p["o"](attn.reshape(b, nq * d)), residual, p["post_norm"]
            )
            partial = p["down"](self.act(p["gate_up"](h)))
        out, _ = self._reduce_add_norm(partial, residual, self.final_norm)
        return out


def _time(platform, comm, fn, iters, warmup) -> float:
    """Microseconds per call of ``fn`` on this rank, the ranks starting the timed loop
    together (a barrier after the warm-up)."""
    from opcore.bench.timing import loop_us

    return loop_us(fn, platform, iters=iters, warmup=warmup, ready=comm.barrier)


def rank_body(comm, cfg: dict) -> list[dict]:
    from opcore.ir import ops
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    dtype = getattr(torch, cfg["dtype"])
    rows = []
    # the collective ops reduce the donated buffers in place (provider in_place)
    with (
        torch.inference_mode(),
        ops.all_reduce.set_priority(["in_place"]),
        ops.fused_all_reduce_add_rms_norm.set_priority(["in_place"]),
    ):
        for batch in cfg["batches"]:
            model = TPDecoder(comm, cfg["shape"], batch, cfg["context"], dtype)
            out = model.step()
            row = {"batch": batch, "tp": comm.world_size}
            row["eager_us"] = _time(platform, comm, model.step, cfg["iters"], cfg["warmup"])
            row["graph_us"], row["graph_note"] = None, ""
            if comm.capture_safe or comm.world_size == 1:
                try:
                    replay = platform.capture_graph(model.step)
                except Exception as exc:
                    row["graph_note"] = f"capture failed: {type(exc).__name__}: {exc}"[:200]
                else:
                    if replay is None:
                        row["graph_note"] = "platform has no graphs"
                    else:
                        row["graph_us"] = _time(platform, comm, replay, cfg["iters"], cfg["warmup"])
            else:
                row["graph_note"] = "communicator not declared capture_safe"
            row["out"] = out.float().cpu()
            rows.append(row)
            del model
            platform.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--tp", default="1,2", help="tensor-parallel sizes to run, in turn")
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--small", action="store_true", help="a small model, few iterations")
    ap.add_argument("--timeout", type=float, default=240.0, help="bound per --tp run, s")
    ap.add_argument("--out", default=None, help="directory for tp_decode_step.json / .md")
    args = ap.parse_args(argv)

    from opcore.distributed import check, run_ranks
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    cfg = {
        "shape": SMALL if args.small else FULL,
        "batches": [int(b) for b in args.batch.split(",")],
        "context": args.context,
        "dtype": args.dtype,
        "iters": 3 if args.small else 50,
        "warmup": 1 if args.small else 10,
    }
    results: dict[int, list[dict]] = {}
    for tp in [int(t) for t in args.tp.split(",")]:
        per_rank = check(
            run_ranks(
                rank_body,
                tp,
                args=(cfg,),
                timeout_s=args.timeout,
                comm_timeout_s=min(120.0, args.timeout),
                env={"OPCORE_PLATFORM": platform.name},
            )
        )
        rows = per_rank[0]
        for i, row in enumerate(rows):  # the slowest rank's times
            for key in ("eager_us", "graph_us"):
                vals = [r[i][key] for r in per_rank if r[i][key] is not None]
                row[key] = max(vals) if vals else None
            row["ranks_bitwise_equal"] = all(torch.equal(r[i]["out"], row["out"]) for r in per_rank)
        results[tp] = rows
    base_tp = next(iter(results))
    table = []
    for rows in results.values():
        for i, row in enumerate(rows):
            ref = results[base_tp][i]["out"]
            row[f"rel_diff_vs_tp{base_tp}"] = float((row["out"] - ref).norm() / ref.norm())
            base = results[base_tp][i]
            row[f"speedup_eager_vs_tp{base_tp}"] = base["eager_us"] / row["eager_us"]
            if row["graph_us"] and base["graph_us"]:
                row[f"speedup_graph_vs_tp{base_tp}"] = base["graph_us"] / row["graph_us"]
            table.append({k: v for k, v in row.items() if k != "out"})
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "platform": platform.name,
        "backend": platform.dist_backend,
        "device": platform.get_device_name(0),
        "torch": torch.__version__,
        "shape": cfg["shape"],
        "context": args.context,
        "dtype": args.dtype,
    }

    def f(v):
        return "" if v is None else f"{v:.1f}"

    lines = [
        "# tensor-parallel decode step (opcore.layers ColumnParallelLinear / "
        "RowParallelLinear, fused_all_reduce_add_rms_norm)",
        "",
        ", ".join(f"{k}: {v}" for k, v in env.items()),
        "",
        "attention: SDPA stand-in over a fixed KV context (local heads)",
        "",
        f"| batch | tp | eager µs | graph µs | × eager vs tp{base_tp} | × graph vs tp{base_tp} "
        f"| rel. diff vs tp{base_tp} | ranks bitwise equal | note |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in sorted(table, key=lambda r: (r["batch"], r["tp"])):
        sg = r.get(f"speedup_graph_vs_tp{base_tp}")
        lines.append(
            f"| {r['batch']} | {r['tp']} | {f(r['eager_us'])} | {f(r['graph_us'])} | "
            f"{r[f'speedup_eager_vs_tp{base_tp}']:.2f} | {'' if sg is None else f'{sg:.2f}'} | "
            f"{r[f'rel_diff_vs_tp{base_tp}']:.1e} | {r['ranks_bitwise_equal']} | "
            f"{r['graph_note']} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_json(
            {"environment": env, "rows": table}, os.path.join(args.out, "tp_decode_step.json")
        )
        with open(os.path.join(args.out, "tp_decode_step.md"), "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
