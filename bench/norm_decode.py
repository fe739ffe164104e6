"""Issue 31's norm rows at decode sizes, where ``rms_norm`` and ``fused_add_rms_norm`` trail
Liger or ``torch.compile`` by 0.01-0.07 us (1-4 %) at 1-8 tokens on the H200: does the
order of the kernel's loads account for it?

With a few rows the call lasts about one memory round trip, spread over up to 32 warps, and
the row's sum of squares crosses warps through shared memory behind a barrier. opcore's
kernel loads the weight after that reduction (`_store_scaled`), so its last loads wait for
the barrier; Liger's loads the weight beside the row. The kernel's ``WEIGHT_FIRST`` issues
the weight's load before the reduction. This times, in bf16 (``--dtype float16`` for
fp16), by graph replay (`opcore.bench.timing`, launch gaps removed), in rounds with the
order rotated:

- ``opcore``: the op as a user calls it (default priority; out of place);
- ``triton``: the triton provider called directly (the launch model's choice; in place for
  ``fused_add_rms_norm``, as `opcore bench` times it);
- ``after_e<E>`` / ``first_e<E>``: opcore's kernel (read by its module-private name on
  purpose: the implementation is what is timed) launched directly, one row a program, the
  weight loaded after or before the reduction, on the warps that give each thread about
  ``E`` elements of the row (``--per-thread``, default 8 and 16; the launch model took 8
  with the weight after until 2026-12-07, and since then takes the weight first on 16, or
  8 while 16 would leave fewer than 4 warps);
- the peers of `opcore.bench.baselines`: ``compile``, ``F.rms_norm``, ``liger``,
  ``flaggems`` (those importable).

Each kernel variant's outputs are checked (`disagreements`): the two load orders on the
same warps bitwise against each other (the weight's place changes no arithmetic), every
variant against the triton provider's to bf16 rounding (1e-2). GPU only, or ``--quick`` under
Triton's interpreter (plumbing: host timers).

Any token count works where one row per program is the launch (hidden sizes over 1024):
``--tokens 32,128,512,1024,2048,4096 --peers=liger`` asked where loading the weight first
stops paying (H100, 2026-12-07, docs/tuning.md): no gain with many rows, and a loss of
5-10 % at 512 x 7168, where 16 warps a row run in two waves. The launch model loads it
first while every program is resident (`_launch.norm_weight_first`).

``--flushed`` times each call by events after a cache flush instead, as `opcore bench`
does past 32 tokens (GPU only): the wide grid's rows at 2048 tokens, where a replayed
graph keeps the rows in L2 and ranks the variants otherwise.

``--sass`` times nothing: it compiles the two orders for sm_90 on this machine and reports
their instruction counts and where the loads sit against the barriers (`sass_rows`).

Usage: python bench/norm_decode.py [--ops rms_norm,fused_add_rms_norm] [--tokens 1,8]
       [--hidden 2560,3584,5120,7168] [--rounds 3] [--per-thread 8,16] [--peers ...]
       [--dtype bfloat16|float16] [--json FILE] [--flushed] [--sass]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __name__ == "__main__" and "--quick" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton's first import

import torch  # noqa: E402

PEERS = ("compile", "F.rms_norm", "liger", "flaggems")


def _launch(x, r, w, out, res, eps: float, block_n: int, warps: int, weight_first: bool):
    """opcore's norm kernel over ``x`` (``[rows, n]``, contiguous), one row a program, one
    pass: the launch `opcore.kernels.triton.norm` makes for few rows."""
    from opcore.kernels.triton import norm

    rows, n = x.shape
    has_res = r is not None
    norm._rms_norm_kernel[(rows,)](
        x, n, r if has_res else x, n, w, out, n, res if has_res else out, n, rows, n, n, eps,
        HAS_RESIDUAL=has_res, HAS_WEIGHT=True, BLOCK_N=block_n, ROWS=1, SINGLE_PASS=True,
        N_CHUNKS=1, WEIGHT_FIRST=weight_first, PARTIAL_VARIANCE=False, num_warps=warps,
    )  # fmt: skip


def variants(
    op: str,
    tokens: int,
    hidden: int,
    device,
    quick: bool,
    per_thread=(8, 16),
    peers=PEERS,
    dtype=torch.bfloat16,
) -> tuple[dict, dict, tuple]:
    """``({name: fn}, {name: fn}, want)`` for ``op`` at ``tokens`` x ``hidden`` in ``dtype``:
    every fn of the first dict is timed; the second holds the kernel variants, each returning its
    outputs (a tuple) for `disagreements` against ``want``, the triton provider's outputs
    out of place, computed before any in-place provider runs."""
    from opcore.bench import baselines, cases
    from opcore.ir import ops
    from opcore.kernels.triton import _launch as model
    from opcore.kernels.triton import norm

    case = cases.build(op, tokens, hidden, dtype, device, quick=quick)
    wanted = {"triton"} | (set() if quick else set(peers))
    fns, _skipped = baselines.providers(case, wanted)
    fns = {"opcore": lambda: getattr(ops, op)(*case.args), **fns}
    if op == "rms_norm":
        x, w, eps = case.args
        r = None
        want = (norm.rms_norm(x, w, eps),)
    else:
        x, r, w, eps = case.args
        want = norm.fused_add_rms_norm(x, r, w, eps)
    out = torch.empty_like(x)
    res = torch.empty_like(x) if r is not None else None
    block_n, _rows, single, _warps = model.row_params(tokens, hidden, model.multiprocessors())
    if not single:
        raise SystemExit(f"{op} {tokens}x{hidden}: not a one-pass launch; nothing to compare")
    checks = {}
    for e in per_thread:
        w_count = model.warps_for(block_n, per_warp=32 * e, cap=32)
        for first in (False, True):

            def run(first=first, w_count=w_count):
                _launch(x, r, w, out, res, float(eps), block_n, w_count, first)
                return (out,) if res is None else (out, res)

            name = f"{'first' if first else 'after'}_e{e}"
            fns[name] = run
            checks[name] = run
    return fns, checks, want


def disagreements(outputs: dict[str, tuple], want: tuple) -> list[str]:
    """What is wrong with the kernel variants' ``outputs`` (name -> output tensors): the two
    load orders on the same warps (``after_e<E>``, ``first_e<E>``) must agree bitwise (the
    weight's place changes no arithmetic), and every variant must agree with the triton
    provider's ``want`` to bf16 rounding (another warp count sums the row's squares in
    another order: at 512 x 1024 on an H100, a last bit differs)."""
    bad = []
    for name, out in outputs.items():
        if not all(
            torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2)
            for a, b in zip(out, want, strict=True)
        ):
            bad.append(f"{name} differs from the triton provider's output")
        if name.startswith("first_"):
            twin = outputs.get("after_" + name[len("first_") :])
            if twin is not None and not all(
                torch.equal(a, b) for a, b in zip(out, twin, strict=True)
            ):
                bad.append(f"{name} is not bitwise {'after_' + name[len('first_') :]}")
    return bad


def sass_rows(op: str, hidden: int) -> list[dict]:
    """The two load orders compiled for sm_90 on this machine (no GPU; `offline_compile`) at
    the launch model's few-row launch, specialised as a one-token call specialises it (one
    row; strides and sizes multiples of 16 where ``hidden`` is, so the loads are 16-byte
    vectors): instruction count, the place of the first and last global load, of the first
    barrier (the reduction's), and how many loads are 16-byte vectors."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from offline_compile import compile_kernel, sass_opcodes

    from opcore.kernels.triton import _launch as model
    from opcore.kernels.triton import norm

    block_n, _rows, _single, warps = model.row_params(1, hidden)
    ptrs = {n: "*bf16" for n in ("x_ptr", "r_ptr", "w_ptr", "out_ptr", "res_ptr")}
    # What a launch specialises: Triton treats an integer argument of 1 as a constant and
    # marks the pointers, and the strides and sizes that are multiples of 16, as such.
    # Without the sizes the column mask is not provably uniform over 8 lanes and the
    # compiled loads are scalar: code no real call runs.
    sizes = ("x_stride", "r_stride", "out_stride", "res_stride", "n_cols", "var_size")
    divisible = (*ptrs, *sizes) if hidden % 16 == 0 else tuple(ptrs)
    out = []
    for first in (False, True):
        consts = dict(HAS_RESIDUAL=op != "rms_norm", HAS_WEIGHT=True, BLOCK_N=block_n, ROWS=1,
                      SINGLE_PASS=True, N_CHUNKS=1, WEIGHT_FIRST=first,
                      PARTIAL_VARIANCE=False, n_rows=1)  # fmt: skip
        kernel = compile_kernel(
            norm._rms_norm_kernel, {**ptrs, "eps": "fp32"}, consts,
            divisible=divisible, num_warps=warps,
        )  # fmt: skip
        opcodes = sass_opcodes(kernel)
        loads = [i for i, o in enumerate(opcodes) if o.startswith("LDG")]
        bars = [i for i, o in enumerate(opcodes) if o.startswith("BAR")]
        out.append({
            "op": op, "hidden": hidden, "warps": warps, "weight_first": first,
            "instructions": len(opcodes), "first_load": loads[0], "last_load": loads[-1],
            "first_barrier": bars[0] if bars else None,
            "vector_loads": sum(opcodes[i].endswith(".128") for i in loads), "loads": len(loads),
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="rms_norm,fused_add_rms_norm")
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--hidden", default="2560,3584,5120,7168")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-thread", default="8,16", help="row elements a thread, per variant")
    ap.add_argument("--peers", default=",".join(PEERS), help="peers to time ('' for none)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny shapes under the interpreter")
    ap.add_argument(
        "--flushed", action="store_true", help="events around each call after a cache flush"
    )
    ap.add_argument(
        "--sass",
        action="store_true",
        help="no timing: each load order's sm_90 instruction count and load places (no GPU)",
    )
    args = ap.parse_args(argv)
    from opcore.bench import report

    op_names = args.ops.split(",")
    hidden = [int(v) for v in args.hidden.split(",")]
    if args.sass:
        rows = [r for op in op_names for h in hidden for r in sass_rows(op, h)]
        print("| op | hidden | warps | weight | instructions | first load | last load | "
              "first barrier |\n|---|---:|---:|---|---:|---:|---:|---:|")  # fmt: skip
        for r in rows:
            where = "first" if r["weight_first"] else "after"
            print(f"| {r['op']} | {r['hidden']} | {r['warps']} | {where} | {r['instructions']} "
                  f"| {r['first_load']} | {r['last_load']} | {r['first_barrier']} |")  # fmt: skip
        if args.json:
            report.write_json(rows, args.json)
        return 0
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rotated_rounds import timed_row, where

    platform, device, timers = where(args.quick)
    if args.flushed:
        if timers != "device":
            raise SystemExit("--flushed needs a device with timing events")
        timers = "flushed"
    tokens = [int(v) for v in args.tokens.split(",")]
    if args.quick:
        hidden = [96, 200]
    rows = []
    for op in op_names:
        for h in hidden:
            for t in tokens:
                fns, checks, want = variants(
                    op, t, h, device, args.quick,
                    tuple(int(v) for v in args.per_thread.split(",")),
                    tuple(filter(None, args.peers.split(","))), getattr(torch, args.dtype),
                )  # fmt: skip
                bad = disagreements({k: tuple(o.clone() for o in f()) for k, f in checks.items()},
                                    want)  # fmt: skip
                if bad:
                    print(f"{op} T={t} H={h}: {'; '.join(bad)}", file=sys.stderr)
                    return 1
                fields = dict(op=op, dtype=args.dtype, tokens=t, hidden=h)
                row = timed_row(fields, fns, platform, timers, args.rounds)
                rows.append(row)
                peers = [k for k in PEERS if k in row]
                best = min(peers, key=lambda k: row[k]) if peers else None
                print(json.dumps(row), f"# best peer: {best}", flush=True)
    if args.json:
        report.write_json(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
