"""Issue 31's gated-activation rows at decode sizes, where ``silu_and_mul`` trails
``torch.compile`` of the native function by 0.04-0.08 us (4-6 %) at 8 tokens on the H200:
which part of the kernel's fixed cost does Inductor's generated kernel avoid?

Inductor compiles for one static shape: its pointwise kernel walks the flattened output
(1-D, int32 indices) and knows ``d`` at compile time, so a row's start and the up half's
offset are constants and the divisions by ``d`` are multiplies. This times, by graph replay
(`opcore.bench.timing`, launch gaps removed), in rounds with the order rotated:

- ``opcore``: ``ops.silu_and_mul`` as a user calls it (default priority);
- ``compile``: ``torch.compile`` of the native function, static shapes;
- ``flat_const_d<B>w<W>``: a flat kernel of ``B`` outputs a program, ``d`` a compile-time
  constant (what Inductor does);
- ``flat_d<B>w<W>``: the same with ``d`` a runtime argument (the division by ``d`` paid);
- ``tile_const_d``: opcore's tile (the launch model's ``BLOCK_C`` x ``ROWS``, 2-D grid) with
  ``d`` a compile-time constant;
- ``tile_masked`` / ``tile_even``: opcore's kernel itself (read by its module-private name
  on purpose: the implementation is what is timed) at the launch model's tile, its loads
  and stores masked (the kernel before 2026-12-07) or not (``EVEN``, what the launcher
  passes where the tiles cover the output exactly).

Every variant's output is checked bitwise against the triton provider's
(``opcore.kernels.triton.activation.silu_and_mul``), compile's to bf16 rounding. GPU only,
or ``--quick`` under Triton's interpreter (plumbing: host timers).

``--sass`` times nothing: it compiles each variant for sm_90 on this machine and counts its
machine instructions and where its first global load comes (`sass_rows`).

Usage: python bench/gated_decode.py [--tokens 1,8] [--inter 9728,13824,18432,18944]
       [--rounds 3] [--json FILE] [--sass]
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


@triton.jit
def _silu_mul(g_ptrs, u_ptrs, out_ptrs, mask):
    """``silu(g) * u`` in fp32, rounded once on store (the shipped kernel's math)."""
    g = tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, (g * tl.sigmoid(g) * u).to(out_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _flat(x_ptr, out_ptr, n, d, D: tl.constexpr, BLOCK: tl.constexpr):
    """The flattened ``[rows, d]`` output, ``BLOCK`` outputs a program; the column count is
    the compile-time ``D`` when it is not 0, else the runtime ``d``."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if D != 0:
        cols = D
    else:
        cols = d
    row_start = x_ptr + (i // cols) * (2 * cols) + i % cols
    _silu_mul(row_start, row_start + cols, out_ptr + i, i < n)


@triton.jit
def _tile_const(x_ptr, out_ptr, n_rows, D: tl.constexpr, BLOCK_C: tl.constexpr,
                ROWS: tl.constexpr):  # fmt: skip
    """The shipped kernel's ``[ROWS, BLOCK_C]`` tile on a 2-D grid, with ``d`` constant."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    x_rows = x_ptr + rows[:, None] * (2 * D) + cols[None, :]
    _silu_mul(x_rows, x_rows + D, out_ptr + rows[:, None] * D + cols[None, :], mask)


def variants(x: torch.Tensor, quick: bool) -> dict:
    """``{name: fn}`` of the variants for input ``x`` (``[tokens, 2d]``)."""
    from opcore.ir import ops
    from opcore.kernels.triton import _launch

    t, d = x.shape[0], x.shape[1] // 2
    out = torch.empty(t, d, dtype=x.dtype, device=x.device)
    n = t * d
    fns = {"opcore": lambda: ops.silu_and_mul(x)}
    if not quick:
        native = ops.silu_and_mul.impls["native"].impl_fn
        fns["compile"] = torch.compile(lambda: native(x), dynamic=False)
    for block, warps in FLAT:
        grid = (triton.cdiv(n, block),)

        def const(block=block, warps=warps, grid=grid):
            _flat[grid](x, out, n, d, D=d, BLOCK=block, num_warps=warps)
            return out

        def runtime(block=block, warps=warps, grid=grid):
            _flat[grid](x, out, n, d, D=0, BLOCK=block, num_warps=warps)
            return out

        fns[f"flat_const_d{block}w{warps}"] = const
        fns[f"flat_d{block}w{warps}"] = runtime
    block_c, rows, warps, _ = _launch.gated_params(t, d, _launch.multiprocessors())

    def tile():
        grid = (triton.cdiv(t, rows), triton.cdiv(d, block_c))
        _tile_const[grid](x, out, t, D=d, BLOCK_C=block_c, ROWS=rows, num_warps=warps)
        return out

    fns["tile_const_d"] = tile
    from opcore.kernels.triton import activation

    for name, even in (("tile_masked", False), ("tile_even", True)):
        if even and not activation.tiles_cover(t, d, rows, block_c):
            continue  # the tiles do not cover this output exactly: no unmasked launch

        def shipped(even=even):
            grid = (triton.cdiv(t, rows), triton.cdiv(d, block_c))
            activation._act_and_mul_kernel[grid](
                x, 2 * d, out, d, t, d, ACT=0, BLOCK_C=block_c, ROWS=rows, COLS_FIRST=0,
                EVEN=even, num_warps=warps,
            )  # fmt: skip
            return out

        fns[name] = shipped
    return fns


FLAT = ((1024, 4), (512, 4), (1024, 8))  # (outputs a program, warps) of the flat variants


def sass_rows(tokens: int, d: int) -> list[dict]:
    """Each variant compiled for sm_90 on this machine (no GPU; `offline_compile`): its
    SASS instruction count and the place of its first global load, the kernel's fixed
    cost before memory. ``shipped`` is opcore's kernel at the launch model's choice,
    read by its module-private name on purpose (the implementation is what is counted);
    alignment as a real launch specialises it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from offline_compile import compile_kernel, sass_opcodes

    from opcore.kernels.triton import _launch, activation

    bf = {"x_ptr": "*bf16", "out_ptr": "*bf16"}
    block_c, rows, warps, cols_first = _launch.gated_params(tokens, d)
    builds = [
        ("shipped", activation._act_and_mul_kernel,
         dict(ACT=0, BLOCK_C=block_c, ROWS=rows, COLS_FIRST=cols_first,
              EVEN=activation.tiles_cover(tokens, d, rows, block_c)),
         ["x_ptr", "out_ptr", "x_stride", "out_stride", "d"], warps),
        ("shipped_masked", activation._act_and_mul_kernel,
         dict(ACT=0, BLOCK_C=block_c, ROWS=rows, COLS_FIRST=cols_first, EVEN=False),
         ["x_ptr", "out_ptr", "x_stride", "out_stride", "d"], warps),
        ("tile_const_d", _tile_const, dict(D=d, BLOCK_C=block_c, ROWS=rows),
         ["x_ptr", "out_ptr"], warps),
    ]  # fmt: skip
    for block, w in FLAT:
        for name, constant in ((f"flat_const_d{block}w{w}", d), (f"flat_d{block}w{w}", 0)):
            builds.append((name, _flat, dict(D=constant, BLOCK=block),
                           ["x_ptr", "out_ptr", "n", "d"], w))  # fmt: skip
    out = []
    for name, fn, consts, divisible, w in builds:
        ops = sass_opcodes(compile_kernel(fn, bf, consts, divisible=divisible, num_warps=w))
        first = next(i for i, op in enumerate(ops) if op.startswith("LDG"))
        out.append({"tokens": tokens, "d": d, "variant": name, "instructions": len(ops),
                    "first_load": first})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--inter", default="9728,13824,18432,18944")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny shapes under the interpreter")
    ap.add_argument(
        "--sass",
        action="store_true",
        help="no timing: each variant's sm_90 instruction count and first load (no GPU)",
    )
    args = ap.parse_args(argv)
    from opcore.bench import report

    if args.sass:
        rows = [
            r
            for d in (int(v) for v in args.inter.split(","))
            for t in (int(v) for v in args.tokens.split(","))
            for r in sass_rows(t, d)
        ]
        print("| tokens | d | variant | instructions | first load at |\n|---:|---:|---|---:|---:|")
        for r in rows:
            print(f"| {r['tokens']} | {r['d']} | {r['variant']} | {r['instructions']} "
                  f"| {r['first_load']} |")  # fmt: skip
        if args.json:
            report.write_json(rows, args.json)
        return 0
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rotated_rounds import timed_row, where

    from opcore.kernels.triton import activation

    platform, device, timers = where(args.quick)
    tokens = [int(v) for v in args.tokens.split(",")]
    inter = [80, 128] if args.quick else [int(v) for v in args.inter.split(",")]
    rows = []
    for d in inter:
        for t in tokens:
            x = torch.randn(t, 2 * d, device=device).to(torch.bfloat16)
            fns = variants(x, args.quick)
            # The triton provider's bits (on the host, ops.silu_and_mul is not the kernel);
            # Inductor's are its own: close, not the same.
            want = activation.silu_and_mul(x).clone()
            bad = [
                k for k, f in fns.items()
                if k not in ("compile", "opcore" if args.quick else "")
                and not torch.equal(f(), want)
            ]  # fmt: skip
            if "compile" in fns and not torch.allclose(
                fns["compile"]().float(), want.float(), atol=1e-2, rtol=1e-2
            ):
                bad.append("compile")
            if bad:
                why = f"T={t} d={d}: differs from the triton provider's output: {bad}"
                print(why, file=sys.stderr)
                return 1
            row = timed_row(dict(tokens=t, d=d), fns, platform, timers, args.rounds)
            rows.append(row)
            best = min((k for k in fns if k != "opcore"), key=lambda k: row[k])
            print(json.dumps(row), f"# best other: {best}", flush=True)
    if args.json:
        report.write_json(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
