"""The data a launch model is fitted to: every launch configuration of the triton norm,
gated-activation, rotary and fused-split kernels timed over a wide grid of real-model
shapes (a GPU tool).

For each op, dtype, width and token count it times the heuristic's configuration
(`opcore.kernels.triton._launch`), every configuration of the op's launch space
(`opcore.kernels.triton.spaces`) and a wider ring around it (more rows per program, warps
1-16, tiles 256-16384; for the head kernels every power-of-two split of a token's heads
on 1-8 warps), each through the real launcher (`opcore.tuning.runtime.forced`), each
checked against the heuristic's output; beside them the eager composition a user would
write (``F.rms_norm``, ``F.silu(g) * u``; the native function for the head kernels) and
``torch.compile`` of the native function (default options: one compile per width, dynamic
over tokens after the second). The head kernels' layouts are the real models' of
``--heads`` (hidden sizes, `opcore.bench.shapes.HEADS`: 32/8 x 64, 8/4 x 256, 28/4, 32/8,
40/8 and 64/8 x 128 by default); their record's ``width`` is that hidden size and
``heads`` the layout.
Timing is `opcore bench`'s timers: graph replay up to ``--graph-tokens`` (1024: the sizes
where one launch's device time is too noisy to rank configurations by), device time after
a cache flush above. One JSON line per shape goes to ``--out``/sweep.jsonl as it is done,
so a run cut short keeps what it measured; ``--budget-s`` starts no shape after it.

    python bench/sweep_launch.py --out DIR [--ops rms_norm,silu_and_mul] [--budget-s 200]
    python bench/sweep_launch.py --out DIR --ops rotary_embedding,split_qkv_rmsnorm_rope
    TRITON_INTERPRET=1 python bench/sweep_launch.py --quick --out DIR   (CPU plumbing)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from opcore.bench import cases, shapes, timing
from opcore.ir import ops
from opcore.kernels.triton import PROVIDER, _launch, spaces
from opcore.platforms import get_current_platform
from opcore.tuning import runtime

# Hidden sizes of the model families people run (Llama, Qwen, Mistral, Gemma, Phi,
# DeepSeek), most of them not powers of two; intermediates likewise.
HIDDEN = (1024, 1536, 2048, 2304, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 12288, 16384)
INTER = (4864, 8960, 9216, 9728, 11008, 13824, 14336, 18432, 18944, 28672)
TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
# Hidden sizes whose models' head layouts the head kernels are swept at (shapes.HEADS).
HEAD_HIDDEN = (2048, 2304, 3584, 4096, 5120, 8192)
HEAD_OPS = ("rotary_embedding", "split_qkv_rmsnorm_rope")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def unique(configs: list[dict[str, int]]) -> list[dict[str, int]]:
    """``configs`` without repeats, first occurrence kept."""
    seen: dict[tuple, dict[str, int]] = {}
    for c in configs:
        seen.setdefault(tuple(sorted(c.items())), c)
    return list(seen.values())


def norm_configs(tokens: int, n: int) -> list[dict[str, int]]:
    out = [dict(c) for c in spaces.norm_candidates(tokens, (n,))]
    if n <= _launch.MAX_FUSED_COLS:
        block = _launch.next_pow2(n)
        rows = 1
        while rows <= min(32, _launch.next_pow2(tokens)) and block * rows <= 16384:
            for w in (1, 2, 4, 8, 16):
                if 32 * w <= block * rows and block * rows <= 128 * 32 * w:
                    out.append({"BLOCK_N": block, "ROWS": rows, "num_warps": w})
            rows *= 2
    # The two-pass path on 1024-column chunks, which tile a width of k x 1024 (5120, 7168)
    # without the masked lanes of a power-of-two row, the second pass re-reading from L2.
    if n > 1024:
        out += [{"BLOCK_N": 1024, "ROWS": 1, "num_warps": w} for w in (1, 2, 4)]
    return unique(out)


def act_configs(tokens: int, d: int) -> list[dict[str, int]]:
    out = [dict(c) for c in spaces.act_candidates(tokens, (d,))]
    for block in (1024, 2048, 4096, 8192):
        for rows in (1, 2, 4):
            el = block * rows
            if rows > _launch.next_pow2(tokens) or el > 8192:
                continue
            for w in (1, 2, 4, 8, 16):
                if not 8 <= el // (32 * w) <= 16:  # elements per thread
                    continue
                for order in (0, 1) if tokens >= 64 else (0,):
                    out.append(
                        {"BLOCK_C": block, "ROWS": rows, "num_warps": w, "COLS_FIRST": order}
                    )
    return unique(out)


def head_configs(tokens: int, heads: tuple) -> list[dict[str, int]]:
    """The head kernels' space candidates, then every power-of-two split of a token's heads
    (up to the smaller group's count) on 1, 2, 4 and 8 warps."""
    out = [dict(c) for c in spaces.head_candidates(tokens, heads)]
    most = _launch.max_head_splits(heads[0], heads[1])
    splits = 1
    while splits <= most:
        out += [{"SPLITS": splits, "num_warps": w} for w in (1, 2, 4, 8)]
        splits *= 2
    return unique(out)


def make_heads(op: str, tokens: int, hidden: int, dtype, device):
    """`make` for the head kernels: `opcore bench`'s case at ``hidden``'s model layout,
    the native function as the eager peer."""
    case = cases.build(op, tokens, hidden, dtype, device, quick=hidden not in shapes.HEADS)
    native = getattr(ops, op).impls["native"].impl_fn
    fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in case.args]
    if op == "rotary_embedding":
        heads = (case.args[1].shape[1] // case.args[3], case.args[2].shape[1] // case.args[3],
                 case.args[3])  # fmt: skip
    else:
        heads = case.extras["heads"]
    return case.args, (lambda: native(*fresh)), tuple(heads), case.nbytes


def make(op: str, tokens: int, width: int, dtype, device):
    g = torch.Generator(device=device).manual_seed(tokens * 31 + width)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    if op == "rms_norm":
        x, w = randn(tokens, width), randn(width)
        return (x, w, 1e-6), (lambda: F.rms_norm(x, (width,), w, 1e-6)), (width,)
    if op == "fused_add_rms_norm":
        x, r, w = randn(tokens, width), randn(tokens, width), randn(width)

        def eager():
            s = x + r
            return F.rms_norm(s, (width,), w, 1e-6), s

        return (x, r, w, 1e-6), eager, (width,)
    x = randn(tokens, 2 * width)
    if op == "silu_and_mul":
        return (x,), (lambda: F.silu(x[:, :width]) * x[:, width:]), (width,)

    def gelu():
        return F.gelu(x[:, :width], approximate="tanh") * x[:, width:]

    return (x, "tanh"), gelu, (width, "tanh")


# Graph replay up to this many tokens (``--graph-tokens``): there these kernels take 2-20
# us, and the device timer's samples (one launch each, after a cache flush) were too noisy
# to rank configurations in the 2026-12-02 sweep: an interquartile range over 30 % of the
# median for 41 % of the configurations at 64 tokens, 22 % at 256 and 9 % at 1024 (3 % at
# 4096), which put the launch model 1.1-3.3x behind "best" configurations at 64-1024
# tokens. Replaying a graph of many calls is the timer `opcore bench` ranks decode sizes by.
GRAPH_TOKENS = 1024


def measure(fn, platform, timers, tokens, rep_ms, graph_tokens=GRAPH_TOKENS) -> dict:
    graph = tokens <= graph_tokens
    samples = timing.bench_samples_us(fn, platform, timers, rep_ms=rep_ms, graph=graph)
    which = "graph" if graph and "graph" in samples else timing.compared_timer(samples, tokens)
    s = samples[which]
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0], s[0], s[0]]
    out = {
        "us": round(statistics.median(s), 3),
        "iqr": round((q[2] - q[0]) / q[1], 4),
        "timer": which,
    }
    if which != "device" and "device" in samples:
        out["device_us"] = round(statistics.median(samples["device"]), 3)
    return out


def same(a, b, exact: bool) -> bool:
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for x, y in zip(a, b, strict=True):
        if exact and not torch.equal(x, y):
            return False
        if not exact and not torch.allclose(x.float(), y.float(), atol=2e-2, rtol=2e-2):
            return False
    return True


def sweep_shape(op_name, tokens, width, dtype, device, platform, timers, opts) -> dict:
    op = getattr(ops, op_name)
    impl = op.impls[PROVIDER]
    heads = op_name in HEAD_OPS
    moved = None
    if heads:
        args, eager, shape, moved = make_heads(op_name, tokens, width, dtype, device)
    else:
        args, eager, shape = make(op_name, tokens, width, dtype, device)
    norm = op_name.endswith("rms_norm")
    space = spaces.SPACES[op_name]
    default = dict(space.default(tokens, shape))
    if heads:
        configs = head_configs(tokens, shape)
    else:
        configs = (norm_configs if norm else act_configs)(tokens, width)
    configs = [default] + [c for c in configs if c != default]
    if opts.max_configs:
        configs = configs[: opts.max_configs]

    # In-place providers (fused_add) overwrite their inputs: the check uses fresh copies.
    def fresh():
        return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)

    want = impl.functional(*fresh())
    rows = []
    for cfg in configs:
        with runtime.forced(op_name, PROVIDER, cfg):
            try:
                got = impl.functional(*fresh())
                # The fused split's per-head norm sums in an order num_warps sets.
                ok = same(got, want, exact=not norm and op_name != "split_qkv_rmsnorm_rope")
                timed = fresh()
                t = measure(
                    lambda timed=timed: impl.impl_fn(*timed),
                    platform,
                    timers,
                    tokens,
                    opts.rep_ms,
                    opts.graph_tokens,
                )
            except Exception as exc:  # a configuration the kernel cannot launch
                rows.append({"config": cfg, "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
        rows.append({"config": cfg, "ok": ok, **t})
    peers = {"torch": measure(eager, platform, timers, tokens, opts.rep_ms, opts.graph_tokens)}
    if opts.compile:
        fn = opts.compiled.setdefault(op_name, torch.compile(op.impls["native"].impl_fn))
        cargs = fresh()
        with contextlib.suppress(Exception):
            fn(*cargs)
            peers["compile"] = measure(
                lambda: fn(*cargs), platform, timers, tokens, opts.rep_ms, opts.graph_tokens
            )
    if moved is None:
        es = torch.empty((), dtype=dtype).element_size()
        moved = es * {"rms_norm": 2 * tokens * width, "fused_add_rms_norm": 4 * tokens * width}.get(
            op_name, 3 * tokens * width
        )
    rec = {
        "op": op_name,
        "dtype": str(dtype).removeprefix("torch."),
        "tokens": tokens,
        "width": width,
        "bytes": moved,
        "default": default,
        "configs": rows,
        "peers": peers,
    }
    if heads:
        rec["heads"] = list(shape)
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="rms_norm,silu_and_mul,fused_add_rms_norm,gelu_and_mul")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--hidden", default=",".join(map(str, HIDDEN)))
    ap.add_argument("--inter", default=",".join(map(str, INTER)))
    ap.add_argument(
        "--heads",
        default=",".join(map(str, HEAD_HIDDEN)),
        help="hidden sizes whose models' head layouts the head kernels are swept at",
    )
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--rep-ms", type=int, default=8)
    ap.add_argument("--max-configs", type=int, default=0)
    ap.add_argument(
        "--graph-tokens",
        type=int,
        default=GRAPH_TOKENS,
        help="time by graph replay up to this many tokens (the device timer above)",
    )
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU interpreter)")
    ap.add_argument("--out", required=True)
    opts = ap.parse_args()
    opts.compiled = {}
    platform = get_current_platform()
    device = torch.device(platform.device_type, 0)
    timers = timing.timers(platform, device)
    tokens = [int(t) for t in opts.tokens.split(",")]
    hidden = [int(h) for h in opts.hidden.split(",")]
    inter = [int(i) for i in opts.inter.split(",")]
    head_hidden = [int(h) for h in opts.heads.split(",")]
    if opts.quick:
        tokens, hidden, inter, opts.compile, opts.max_configs = [1, 8], [96], [80], False, 3
        head_hidden = [96]  # not a shapes.HEADS size: `opcore bench --quick`'s 4/2 x 64
    os.makedirs(opts.out, exist_ok=True)
    path = os.path.join(opts.out, "sweep.jsonl")
    start = time.perf_counter()
    done = left = 0
    with open(path, "w") as fh:
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else device.type
        fh.write(
            json.dumps(
                {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
            )
            + "\n"
        )
        # Widths outer, tokens inner, ops interleaved: a run cut short still covers
        # every op at the widths it reached.
        jobs = []
        for dname in opts.dtypes.split(","):
            for i in range(max(len(hidden), len(inter), len(head_hidden))):
                for op_name in opts.ops.split(","):
                    widths = (
                        head_hidden
                        if op_name in HEAD_OPS
                        else hidden
                        if op_name.endswith("rms_norm")
                        else inter
                    )
                    if i < len(widths):
                        jobs += [(op_name, t, widths[i], DTYPES[dname]) for t in tokens]
        for op_name, t, w, dtype in jobs:
            if time.perf_counter() - start > opts.budget_s:
                left += 1
                continue
            rec = sweep_shape(op_name, t, w, dtype, device, platform, timers, opts)
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            done += 1
            best = min((r for r in rec["configs"] if r.get("ok")), key=lambda r: r["us"])
            heur = rec["configs"][0]
            print(
                f"{op_name} {rec['dtype']} T={t} W={w}: heuristic {heur.get('us')} "
                f"best {best['us']} {best['config']} peers {rec['peers']}",
                flush=True,
            )
    print(f"{done} shapes in {time.perf_counter() - start:.0f} s; {left} not started")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
