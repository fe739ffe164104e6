"""Issue 31's two norm leads that no launch configuration closes (H100, 2026-12-07,
`bench/results/2026-12-07-h100-session14/`), each timed against the op and its peers:

1. ``rms_norm`` at many rows of 5120-7168 columns runs 0.1-1.7 % behind ``torch.compile``
   (95-97 against 96-98 % of copy), and every launch of opcore's kernel lands within 1.9 %
   of its own best. Inductor's kernel walks the row twice, the first pass loading with
   ``evict_last`` (the row is read again) and the second with ``evict_first``; opcore's
   holds the row in registers and gives the cache no hints. Variants (bench-local kernels,
   one row a program):

   - ``one_pass`` / ``one_pass_hints``: the row in registers on the launch model's tile and
     warps, plain or with ``evict_first`` on the row and ``evict_last`` on the weight (the
     control and the hint, same code);
   - ``two_pass_<C>w<W>``: Inductor's form on ``C``-column chunks and ``W`` warps, with its
     hints.

2. ``fused_add_rms_norm`` at 1-8 tokens in fp16 runs 1-5 % behind Liger at 5120-7168
   columns, where opcore's fp16 and bf16 times are equal and Liger's fp16 ones are 5-9 %
   below its bf16 ones. Liger rounds the normalised row to the input dtype and multiplies
   by the weight in that dtype; opcore's op multiplies in fp32 and rounds once. Variants on
   the launch model's few-row tile, the weight loaded first:

   - ``fp32_weight``: opcore's arithmetic (the control);
   - ``half_weight``: Liger's (a different result: checked only to 1e-2).

Timed as `opcore bench` times: graph replay up to 32 tokens, else events after a cache
flush (`rotated_rounds`), the providers in rotated rounds; ``opcore`` is the op as a user
calls it (default priority, out of place). Every variant's output is checked against the
triton provider's to 1e-2 before timing. GPU only, or ``--quick`` under Triton's
interpreter (plumbing: host timers, tiny shapes; with ``--dtype float16``, since the
interpreter computes on numpy, which has no bf16 arithmetic for ``half_weight``).

Usage: python bench/norm_variants.py [--ops rms_norm,fused_add_rms_norm]
       [--tokens 2048,16384] [--hidden 5120,7168] [--dtype bfloat16|float16] [--rounds 3]
       [--peers compile,liger] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __name__ == "__main__" and "--quick" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton's first import

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# (chunk columns, warps) of the two-pass variants; ``--quick``'s rows of 96 and 200 take
# chunks of 64.
TWO_PASS = ((2048, 8), (2048, 4), (4096, 8))
QUICK_TWO_PASS = ((64, 2),)


@triton.jit
def _one_pass(x_ptr, w_ptr, out_ptr, n, eps, BLOCK: tl.constexpr, EV_X: tl.constexpr,
              EV_W: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64) * n
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(x_ptr + row + cols, mask=ok, other=0.0, eviction_policy=EV_X).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0, eviction_policy=EV_W).to(tl.float32)
    tl.store(out_ptr + row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _two_pass(x_ptr, w_ptr, out_ptr, n, eps, CHUNK: tl.constexpr, N_CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * n
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for c in range(N_CHUNKS):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(x_ptr + row + cols, mask=cols < n, other=0.0, eviction_policy="evict_last")
        x = x.to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n + eps)
    for c in range(N_CHUNKS):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        ok = cols < n
        x = tl.load(x_ptr + row + cols, mask=ok, other=0.0, eviction_policy="evict_first")
        w = tl.load(w_ptr + cols, mask=ok, other=0.0, eviction_policy="evict_last")
        y = x.to(tl.float32) * rstd * w.to(tl.float32)
        tl.store(out_ptr + row + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _fused_add(x_ptr, r_ptr, w_ptr, out_ptr, res_ptr, n, eps, BLOCK: tl.constexpr,
               HALF_WEIGHT: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64) * n
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    x = tl.load(x_ptr + row + cols, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row + cols, mask=ok, other=0.0).to(tl.float32)
    s = (x + r).to(res_ptr.dtype.element_ty)
    tl.store(res_ptr + row + cols, s, mask=ok)
    sf = s.to(tl.float32)
    y = sf * tl.rsqrt(tl.sum(sf * sf, axis=0) / n + eps)
    if HALF_WEIGHT:
        y = y.to(w.dtype) * w
    else:
        y = y * w.to(tl.float32)
    tl.store(out_ptr + row + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def variants(op: str, case, two_pass=TWO_PASS) -> dict:
    """``{name: fn}`` of the variants of ``op`` for ``case`` (`opcore.bench.cases.Case`),
    each returning its outputs (a tuple); ``two_pass``: the two-pass variants' (chunk,
    warps)."""
    from opcore.kernels.triton import _launch

    tokens, n = case.tokens, case.hidden
    block, _rows, _single, warps = _launch.row_params(tokens, n, _launch.multiprocessors())
    fns = {}
    if op == "rms_norm":
        x, w, eps = case.args
        out = torch.empty_like(x)
        for name, ev_x, ev_w in (("one_pass", "", ""), ("one_pass_hints", "evict_first",
                                                           "evict_last")):  # fmt: skip

            def one(ev_x=ev_x, ev_w=ev_w):
                _one_pass[(tokens,)](x, w, out, n, eps, BLOCK=block, EV_X=ev_x, EV_W=ev_w,
                                     num_warps=warps)  # fmt: skip
                return (out,)

            fns[name] = one
        for chunk, cw in two_pass:
            if chunk >= n:
                continue  # one chunk: no second walk to hint

            def two(chunk=chunk, cw=cw):
                _two_pass[(tokens,)](x, w, out, n, eps, CHUNK=chunk,
                                     N_CHUNKS=triton.cdiv(n, chunk), num_warps=cw)  # fmt: skip
                return (out,)

            fns[f"two_pass_{chunk}w{cw}"] = two
    else:
        x, r, w, eps = case.args
        out, res = torch.empty_like(x), torch.empty_like(x)
        for name, half in (("fp32_weight", False), ("half_weight", True)):

            def fused(half=half):
                _fused_add[(tokens,)](x, r, w, out, res, n, eps, BLOCK=block, HALF_WEIGHT=half,
                                      num_warps=warps)  # fmt: skip
                return out, res

            fns[name] = fused
    return fns


def disagreements(outputs: dict[str, tuple], want: tuple) -> list[str]:
    """The variants whose outputs differ from ``want`` (the triton provider's) beyond 1e-2."""
    return [
        name
        for name, got in outputs.items()
        if not all(
            torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2)
            for a, b in zip(got, want, strict=True)
        )
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="rms_norm,fused_add_rms_norm")
    ap.add_argument("--tokens", default="2048,16384")
    ap.add_argument("--hidden", default="5120,7168")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peers", default="compile,liger", help="peers to time ('' for none)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny shapes under the interpreter")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rotated_rounds import timed_row, where

    from opcore.bench import baselines, cases, report, timing
    from opcore.ir import ops
    from opcore.kernels.triton import norm

    platform, device, timers = where(args.quick)
    dtype = getattr(torch, args.dtype)
    hidden = [96, 200] if args.quick else [int(v) for v in args.hidden.split(",")]
    peers = set() if args.quick else set(filter(None, args.peers.split(",")))
    rows = []
    for op in args.ops.split(","):
        for h in hidden:
            for t in (int(v) for v in args.tokens.split(",")):
                case = cases.build(op, t, h, dtype, device, quick=args.quick)
                want = getattr(norm, op)(*case.args)
                want = (want,) if op == "rms_norm" else want
                kernels = variants(op, case, QUICK_TWO_PASS if args.quick else TWO_PASS)
                bad = disagreements({k: tuple(o.clone() for o in f()) for k, f in kernels.items()},
                                    want)  # fmt: skip
                if bad:
                    print(f"{op} T={t} H={h}: {bad} differ from the provider's", file=sys.stderr)
                    return 1
                fns, _skipped = baselines.providers(case, peers)
                fns = {"opcore": lambda op=op, case=case: getattr(ops, op)(*case.args), **fns}
                fns.update(kernels)
                # `opcore bench`'s timers: graph replay up to timing.GRAPH_TOKENS rows.
                graph = t <= timing.GRAPH_TOKENS or timers != "device"
                timer = timers if graph else "flushed"
                fields = dict(op=op, dtype=args.dtype, tokens=t, hidden=h)
                row = timed_row(fields, fns, platform, timer, args.rounds)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        report.write_json(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
