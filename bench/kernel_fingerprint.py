"""Fingerprint the machine code of the core's Triton kernels, compiled ahead of time.

It reads the kernels by their module-private names on purpose: what it fingerprints is the
implementation, not an API.

A refactor of a kernel's source (a shared ``@triton.jit`` helper instead of a copy, a
renamed variable) should leave the code the GPU runs unchanged. This compiles each kernel
of the core at the launch configurations its launchers use, for a GPU target given on the
command line (no GPU needed: Triton compiles to the target's binary on any host), and prints
one SHA-256 per kernel and configuration of the binary (cubin or hsaco) and of the
assembly, with line information off so that moved lines do not count. Run it before and
after a change and compare:

    python bench/kernel_fingerprint.py --target cuda:90 > before.json
    ... edit ...
    python bench/kernel_fingerprint.py --target cuda:90 --compare before.json

``--compare`` says per configuration "same binary" or "DIFFERENT binary" and exits 1 on a
difference. Equal binaries mean equal numerics and launch shapes: a refactor needs no new
benchmark. An equal binary with a different assembly text (ptx) is an order of independent
instructions that the assembler schedules back. A different binary is not a verdict
(benchmark it on the device), only a place to look.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

POINTERS_FP = {"fp16": "*fp16", "bf16": "*bf16"}


def _grid(**axes) -> Iterator[dict[str, Any]]:
    keys = list(axes)
    for values in itertools.product(*(axes[k] for k in keys)):
        yield dict(zip(keys, values, strict=True))


def cases() -> Iterator[
    tuple[str, Any, dict[str, str], tuple[str, ...], dict[str, Any], dict[str, Any]]
]:
    """``(label, kernel, pointers, floats, constexprs, options)`` for every configuration
    (`prefill_cases` for the paged prefill kernel)."""
    from opcore.attention.backends import _triton_kernels as attn
    from opcore.kernels.triton import activation, norm, qk_norm_rope, rotary

    for dt in ("fp16", "bf16"):
        p = POINTERS_FP[dt]
        ptrs = {n: p for n in ("x_ptr", "r_ptr", "w_ptr", "out_ptr", "res_ptr")}
        for c in _grid(
            HAS_RESIDUAL=(False, True),
            HAS_WEIGHT=(False, True),
            shape=((1024, 4, True, 1, 8), (4096, 1, True, 1, 8), (4096, 1, False, 4, 8)),
            # False: the variance over the whole row, the launch without a variance_size
            PARTIAL_VARIANCE=(True, False),
        ):
            block_n, rows, single, chunks, warps = c.pop("shape")
            c.update(BLOCK_N=block_n, ROWS=rows, SINGLE_PASS=single, N_CHUNKS=chunks)
            yield ("rms_norm", norm._rms_norm_kernel, ptrs, ("eps",), c, {"num_warps": warps})
        # The few-row launch: the weight loaded first.
        for residual, partial in itertools.product((False, True), (True, False)):
            c = dict(HAS_RESIDUAL=residual, HAS_WEIGHT=True, BLOCK_N=4096, ROWS=1,
                     SINGLE_PASS=True, N_CHUNKS=1, WEIGHT_FIRST=True,
                     PARTIAL_VARIANCE=partial)  # fmt: skip
            yield ("rms_norm", norm._rms_norm_kernel, ptrs, ("eps",), c, {"num_warps": 8})

        for act, cols_first, even in itertools.product((0, 1, 2), (0, 1), (False, True)):
            yield (
                "act_and_mul",
                activation._act_and_mul_kernel,
                {"x_ptr": p, "out_ptr": p},
                (),
                {"ACT": act, "BLOCK_C": 1024, "ROWS": 2, "COLS_FIRST": cols_first, "EVEN": even},
                {"num_warps": 8},
            )

        ptrs = {n: p for n in ("q_ptr", "qo_ptr", "k_ptr", "ko_ptr")}
        ptrs.update(pos_ptr="*i64", cache_ptr="*fp32")
        for c in _grid(IS_NEOX=(False, True), HAS_KEY=(False, True), COPY_TAIL=(False, True)):
            c.update(BLOCK_Q=32, BLOCK_K=8, HALF_PAD=64, TAIL_PAD=64 if c["COPY_TAIL"] else 1)
            yield ("rotary", rotary._rotary_kernel, ptrs, (), c, {"num_warps": 4})

        ptrs = {n: p for n in ("qkv_ptr", "q_ptr", "k_ptr", "v_ptr", "qw_ptr", "kw_ptr")}
        ptrs.update(pos_ptr="*i64", cache_ptr="*fp32")
        for c in _grid(IS_NEOX=(False, True), HAS_WEIGHT=(False, True), HAS_TAIL=(False, True)):
            c.update(
                BLOCK_Q=32,
                BLOCK_KV=8,
                HALF_PAD=64,
                TAIL_PAD=64 if c["HAS_TAIL"] else 1,
                HEAD_PAD=128,
            )
            yield (
                "split_qkv_rmsnorm_rope",
                qk_norm_rope._split_qkv_rmsnorm_rope_kernel,
                ptrs,
                ("eps",),
                c,
                {"num_warps": 2},
            )

        meta = {"query_start_loc": "*i32", "seq_lens": "*i32", "block_table": "*i32"}
        ptrs = {"Q": p, "K": p, "V": p, "Out": p, **meta}
        for c in _grid(CAUSAL=(False, True), SOFTCAP=(0.0, 30.0)):
            c.update(
                GROUP=4,
                GROUP_PAD=4,
                BLOCK_Q=16,
                BLOCK_N=64,
                HEAD=128,
                HEAD_PAD=128,
                INTERPRET=False,
            )
            yield (
                "paged_attention",
                attn.paged_attention_kernel,
                ptrs,
                ("qk_scale",),
                c,
                {"num_warps": 4, "num_stages": 2},
            )
        ptrs = {**ptrs, "Part_acc": "*fp32", "Part_ml": "*fp32"}
        for c in _grid(SPLIT=(False, True), SOFTCAP=(0.0, 30.0)):
            c.update(GROUP=4, BLOCK_H=16, BLOCK_N=64, HEAD=128, HEAD_PAD=128, INTERPRET=False)
            yield (
                "paged_decode",
                attn.paged_decode_kernel,
                ptrs,
                ("qk_scale",),
                c,
                {"num_warps": 4, "num_stages": 2},
            )
        yield (
            "paged_decode_reduce",
            attn.paged_decode_reduce_kernel,
            {"Out": p, "Part_acc": "*fp32", "Part_ml": "*fp32", "query_start_loc": "*i32"},
            (),
            {"HEAD": 128, "HEAD_PAD": 128, "SPLITS_PAD": 8},
            {"num_warps": 4},
        )
        yield (
            "write_kv",
            attn.write_kv_kernel,
            {"Key": p, "Value": p, "KC": p, "VC": p, "slot_mapping": "*i64"},
            (),
            {"NUM_KV_HEADS": 8, "HEAD": 128, "HEADS_PAD": 8, "HEAD_PAD": 128},
            {"num_warps": 4},
        )


def prefill_cases() -> Iterator[tuple[str, Any, dict[str, str], dict[str, Any], dict, list]]:
    """``(label, kernel, types, constexprs, options, divisible)`` of the paged prefill
    kernel at each shipped launch (head sizes 64, 128 and 256 on pages of 16 and 128, the
    descriptor tiles where the platform copies them, head size 128's short-context tiles,
    groups of 4 and of 7), compiled with the alignment a real cache gives (the tensors and
    the strides, multiples of 16): the launches' own machine code, pipelined copies
    included."""
    import torch
    from prefill_registers import prefill_build

    from opcore.attention.backends import _triton_prefill as P

    for dt, head, page, group, short in itertools.product(
        ("fp16", "bf16"), (64, 128, 256), (16, 128), (4, 7), (False, True)
    ):
        if short and not P.short_context_tiles(head, 1):
            continue  # no short-context tiles at this head size
        dtype = torch.float16 if dt == "fp16" else torch.bfloat16
        cfg = P.prefill_launch_config(head, dtype, page, kv_descriptors=True, short_context=short)
        kernel, types, constexprs, options, divisible = prefill_build(cfg, head, page, group, dt)
        yield "paged_prefill aligned", kernel, types, constexprs, options, divisible


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target",
        default="cuda:90",
        help="backend:arch, e.g. cuda:90 (H100/H200) or hip:gfx942 (default cuda:90)",
    )
    parser.add_argument(
        "--only", default=None, help="fingerprint only kernels whose label has this"
    )
    parser.add_argument(
        "--compare",
        default=None,
        metavar="JSON",
        help="a previous run's output: report which binaries changed",
    )
    args = parser.parse_args(argv)
    before = None
    if args.compare:
        with open(args.compare, encoding="utf-8") as f:
            before = json.load(f)
    # Before Triton reads it: no line information in the assembly or the binary.
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="opcore-fingerprint-")
    os.environ.pop("TRITON_INTERPRET", None)
    from offline_compile import compile_kernel, signature

    out: dict[str, dict[str, str]] = {}
    # The other kernels compile with no argument specialised as aligned (`offline_compile`),
    # so that the fingerprints of earlier runs stay comparable.
    every = [
        (label, fn, {**ptrs, **{name: "fp32" for name in floats}}, constexprs, options, [])
        for label, fn, ptrs, floats, constexprs, options in cases()
    ]
    for label, fn, types, constexprs, options, divisible in every + list(prefill_cases()):
        if args.only and args.only not in label:
            continue
        sig = signature(fn, types, constexprs)
        compiled = compile_kernel(
            fn, types, constexprs, divisible=divisible, target=args.target, **options
        )
        asm = compiled.asm
        binary = asm.get("cubin") or asm.get("hsaco")
        text = asm.get("ptx") or asm.get("amdgcn")
        key = f"{label} {sig[next(iter(types))]} " + " ".join(
            f"{k}={v}" for k, v in sorted({**constexprs, **options}.items())
        )
        out[key] = {
            "binary": hashlib.sha256(binary).hexdigest()[:16],
            "asm": hashlib.sha256(text.encode()).hexdigest()[:16],
        }
        print(key, out[key]["binary"], file=sys.stderr, flush=True)
    if before is None:
        json.dump(out, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    changed = 0
    for key, now in out.items():
        was = before.get(key)
        if was is None:
            verdict = "new configuration"
        elif was["binary"] != now["binary"]:
            verdict = "DIFFERENT binary"
            changed += 1
        elif was["asm"] != now["asm"]:
            verdict = "same binary (assembly text reordered)"
        else:
            verdict = "same binary"
        print(f"{verdict}: {key}")
    print(f"{len(out)} configurations, {changed} with a different binary")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
