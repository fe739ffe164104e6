"""Registers, spills and residency of the launch model's choices over a wide grid of
real-model shapes, compiled for a GPU this machine need not have (issue 31: shapes nobody
tuned).

Each op of the grid is called as a user's call reaches its Triton launcher, with tuning off
(the launch model decides), on tensors of the ``meta`` device: nothing is allocated and
nothing runs. The launch it makes is captured instead of run, compiled by Triton for
``--arch`` (default sm_90: H100, H200) exactly as that launch would specialise the kernel
(`offline_compile.compile_call`), and measured by the ``ptxas -v`` Triton ships: registers
per thread and spill bytes. From those and sm_90's limits (65,536 registers, 64 warps and
32 programs a multiprocessor, registers allocated in eights) follows how many warps of the
launch a multiprocessor holds at once.

What it checks, no GPU needed:

- **spills** anywhere on the grid: a launch the model picks that cannot keep its tile in
  registers, a cliff no table entry was fitted to catch;
- **the norm's residency figure**: the weight-first bound (`_launch.norm_weight_first`)
  counts the warps of the norm kernel a multiprocessor holds from the registers a thread
  it assumes for the launch's loads (`_launch.norm_resident_warps`: 40 on 16-byte vectors,
  64 on scalar loads). Each weight-first launch's own count is set against it.

The fp8 kernels are captured as a GPU with fp8 conversions launches them (the device
converts, ``SATURATES``), whatever this machine's platform declares.

Usage: python bench/launch_registers.py [--arch 90] [--quick] [--out FILE.md] [--jsonl F]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Widths of the model families people run (Llama, Qwen, Mistral, Gemma, Phi, DeepSeek),
# most of them not powers of two.
HIDDEN = (1024, 1536, 2048, 2304, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 12288, 16384)
INTERMEDIATE = (
    4096, 4864, 6144, 8192, 8960, 9728, 11008, 13824, 14336, 17920, 18432, 18944, 24576,
    27648, 28672, 29568, 36864, 53248, 57344,
)  # fmt: skip
# (query heads, kv heads, head size)
HEADS = (
    (8, 1, 256), (16, 8, 256), (32, 8, 64), (24, 8, 128), (28, 4, 128), (32, 8, 128),
    (40, 8, 128), (64, 8, 128), (64, 16, 128), (96, 8, 128), (128, 8, 128),
)  # fmt: skip
TOKENS = (1, 8, 64, 512, 2048, 16384, 65536)
DTYPES = ("bfloat16", "float16", "float32")
QUICK = {"hidden": (3584,), "intermediate": (9728,), "heads": ((28, 4, 128),), "tokens": (8,)}

# sm_90 (Hopper) multiprocessor limits.
SM_REGISTERS = 65536
SM_WARPS = 64
SM_PROGRAMS = 32
REGISTER_GRANULE = 8  # registers a thread are allocated in eights


def resident_warps(registers: int, warps: int) -> int:
    """Warps of a launch of ``warps``-warp programs at ``registers`` a thread that one sm_90
    multiprocessor holds at once: whole programs, within its registers, warps and program
    slots (shared memory does not bind these kernels)."""
    per_thread = -(-max(registers, 1) // REGISTER_GRANULE) * REGISTER_GRANULE
    programs = min(SM_PROGRAMS, SM_WARPS // warps, SM_REGISTERS // (per_thread * 32 * warps))
    return programs * warps


@contextlib.contextmanager
def captured() -> Iterator[list[tuple[Any, tuple, dict]]]:
    """Within the block, the Triton providers' launches are recorded as ``(kernel, args,
    kwargs)`` and not run. It replaces the core's one launch function
    (`opcore.kernels.triton._bound.launch`) for the block: a bench's reach into the
    implementation, on purpose."""
    from opcore.kernels.triton import _bound

    seen: list[tuple[Any, tuple, dict]] = []

    def record(kernel, grid, *args, scratch_device=None, **options):
        seen.append((kernel, args, options))

    real = _bound.launch
    _bound.launch = record
    try:
        yield seen
    finally:
        _bound.launch = real


def calls(quick: bool) -> Iterator[tuple[str, str, str, Callable[[], Any]]]:
    """``(op, dtype, shape label, call)`` over the grid: each call runs the op's Triton
    launcher on meta tensors."""
    import torch

    from opcore.kernels.triton import activation, norm, qk_norm_rope, quant, rotary

    hidden = QUICK["hidden"] if quick else HIDDEN
    inter = QUICK["intermediate"] if quick else INTERMEDIATE
    heads = QUICK["heads"] if quick else HEADS
    tokens = QUICK["tokens"] if quick else TOKENS
    dtypes = ("bfloat16",) if quick else DTYPES

    def meta(*shape, dtype):
        return torch.empty(shape, dtype=dtype, device="meta")

    f32 = torch.float32
    scale = meta(1, dtype=f32)
    for name in dtypes:
        dt = getattr(torch, name)
        for t in tokens:
            for h in hidden:
                x, w = meta(t, h, dtype=dt), meta(h, dtype=dt)
                label = f"{t} x {h}"
                yield "rms_norm", name, label, lambda x=x, w=w: norm.rms_norm(x, w, 1e-6)
                yield (
                    "fused_add_rms_norm", name, label,
                    lambda x=x, w=w: norm.fused_add_rms_norm(x, x, w, 1e-6),
                )  # fmt: skip
                if name == "float32":
                    continue  # the fp8 ops take 16-bit inputs in the models above
                yield (
                    "rms_norm_static_fp8_quant", name, label,
                    lambda x=x, w=w: quant.rms_norm_static_fp8_quant(x, w, 1e-6, scale),
                )  # fmt: skip
                yield (
                    "fused_add_rms_norm_static_fp8_quant", name, label,
                    lambda x=x, w=w: quant.fused_add_rms_norm_static_fp8_quant(
                        x, x, w, 1e-6, scale
                    ),
                )  # fmt: skip
                yield (
                    "rms_norm_dynamic_per_token_quant", name, label,
                    lambda x=x, w=w: quant.rms_norm_dynamic_per_token_quant(x, w, 1e-6),
                )  # fmt: skip
                yield (
                    "dynamic_per_token_scaled_fp8_quant", name, label,
                    lambda x=x: quant.dynamic_per_token_scaled_fp8_quant(x),
                )  # fmt: skip
            for d in inter:
                x = meta(t, 2 * d, dtype=dt)
                label = f"{t} x {d}"
                yield "silu_and_mul", name, label, lambda x=x: activation.silu_and_mul(x)
                yield (
                    "gelu_and_mul(tanh)", name, label,
                    lambda x=x: activation.gelu_and_mul(x, "tanh"),
                )  # fmt: skip
                yield "gelu_and_mul", name, label, lambda x=x: activation.gelu_and_mul(x)
                if name != "float32":
                    yield (
                        "silu_and_mul_fp8_quant", name, label,
                        lambda x=x: quant.silu_and_mul_fp8_quant(x, scale),
                    )  # fmt: skip
            for hq, hk, hs in heads:
                label = f"{t} x {hq}/{hk} x {hs}"
                pos = meta(t, dtype=torch.int64)
                cache = meta(8192, hs, dtype=f32)
                q, k = meta(t, hq * hs, dtype=dt), meta(t, hk * hs, dtype=dt)
                yield (
                    "rotary_embedding", name, label,
                    lambda q=q, k=k, pos=pos, cache=cache, hs=hs: rotary.rotary_embedding(
                        pos, q, k, hs, cache, True
                    ),
                )  # fmt: skip
                qkv = meta(t, (hq + 2 * hk) * hs, dtype=dt)
                qw, kw = meta(hs, dtype=dt), meta(hs, dtype=dt)
                yield (
                    "split_qkv_rmsnorm_rope", name, label,
                    lambda qkv=qkv, pos=pos, cache=cache, qw=qw, kw=kw, hq=hq, hk=hk, hs=hs: (
                        qk_norm_rope.split_qkv_rmsnorm_rope(
                            qkv, qw, kw, 1e-6, pos, cache, hq, hk, hs, True
                        )
                    ),
                )  # fmt: skip


def rule_resident_warps(kernel, args: tuple) -> int:
    """The warps a multiprocessor holds that the launch model counts for a norm launch
    (`_launch.norm_resident_warps` for its loads, on the fitted device)."""
    from opcore.kernels.triton import _launch

    a = dict(zip((p.name for p in kernel.params), args, strict=False))
    vector = _launch.norm_vector_loads(
        a["x_ptr"].element_size(),
        *(a[k] for k in ("n_cols", "x_stride", "r_stride", "out_stride", "res_stride")),
    )
    return _launch.norm_resident_warps(None, vector)


def as_gpu_launches(kwargs: dict) -> dict:
    """A captured launch's keyword arguments as a GPU with fp8 conversions passes them: the
    device converts and saturates (this machine's platform may declare neither)."""
    if "ENCODE" in kwargs:
        return {**kwargs, "ENCODE": False, "EMULATE": False, "SATURATES": True}
    return kwargs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--arch", type=int, default=90,
        help="compute capability x 10 (the residency counts sm_90's limits whatever it is)",
    )  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="one shape per op, bf16")
    ap.add_argument("--out", help="also write the markdown report here")
    ap.add_argument("--jsonl", help="write one JSON line per distinct launch here")
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, not interpreted ones
    os.environ["OPCORE_TUNING"] = "off"  # the launch model, not a table
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="opcore-launch-regs-"))
    import logging

    # The launch model warns once that no driver reports a multiprocessor count, and then
    # sizes launches for its fitted device's 132 (an H100 or H200): the figure wanted here.
    logging.getLogger("opcore.kernels.triton._launch").setLevel(logging.ERROR)
    from offline_compile import bind_call, compile_call, ptxas_report

    from opcore.kernels.triton import quant

    target = f"cuda:{args.arch}"
    launches: dict[tuple, dict] = {}  # launch key -> report and the shapes that reach it
    t0 = time.perf_counter()
    with captured() as seen, quant.codes_encoded(False):
        for op, dtype, label, call in calls(args.quick):
            seen.clear()
            call()
            for kernel, kargs, kwargs in seen:
                kwargs = as_gpu_launches(kwargs)
                sig, constexprs, attrs, options = bind_call(kernel, kargs, kwargs, target)
                key = (
                    kernel.__name__,
                    tuple(sorted(sig.items())),
                    tuple(sorted((str(k), repr(v)) for k, v in constexprs.items())),
                    tuple(sorted((str(k), repr(v)) for k, v in attrs.items())),
                    options.num_warps,
                    options.num_stages,
                )
                entry = launches.get(key)
                if entry is None:
                    names = [p.name for p in kernel.params]
                    shown = {names[k[0]]: v for k, v in constexprs.items() if len(k) == 1}
                    report = ptxas_report(compile_call(kernel, kargs, kwargs, target), args.arch)
                    entry = launches[key] = {
                        "kernel": kernel.__name__,
                        "num_warps": options.num_warps,
                        "constexprs": {k: v for k, v in shown.items() if k.isupper()},
                        **report,
                        "resident_warps": resident_warps(report["registers"], options.num_warps),
                        "uses": [],
                    }
                    if kernel.__name__ == "_rms_norm_kernel":
                        entry["rule_resident_warps"] = rule_resident_warps(kernel, kargs)
                    print(
                        f"{len(launches):4d} {kernel.__name__} w{options.num_warps} "
                        f"{entry['constexprs']}: {report['registers']} registers, "
                        f"{report['spill_stores']} B spilled",
                        file=sys.stderr,
                        flush=True,
                    )
                entry["uses"].append((op, dtype, label))
    elapsed = time.perf_counter() - t0
    text = report_markdown(launches, args.arch, elapsed)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.jsonl:
        with open(args.jsonl, "w") as f:
            for entry in launches.values():
                f.write(json.dumps(entry, default=str) + "\n")
    return 0


def report_markdown(launches: dict, arch: int, elapsed: float) -> str:
    by_op: dict[tuple[str, str], dict[int, dict]] = {}  # (op, dtype) -> its launches by id
    shapes: dict[tuple[str, str], int] = {}
    for entry in launches.values():
        for op, dtype, _label in entry["uses"]:
            by_op.setdefault((op, dtype), {})[id(entry)] = entry
            shapes[(op, dtype)] = shapes.get((op, dtype), 0) + 1
    lines = [
        f"# The launch model's choices compiled for sm_{arch}: registers, spills, residency",
        "",
        f"{len(launches)} distinct launches over {sum(shapes.values())} op calls, "
        f"{elapsed:.0f} s. Resident warps: per multiprocessor, from the registers and sm_90's "
        "limits.",
        "",
        "| op | dtype | shapes | launches | warps | registers | spilling launches "
        "| fewest resident warps / SM |",
        "|---|---|---:|---:|---|---|---:|---:|",
    ]
    for (op, dtype), entries in sorted(by_op.items()):
        uniq = list(entries.values())
        warps = sorted({e["num_warps"] for e in uniq})
        regs = [e["registers"] for e in uniq]
        spills = sum(1 for e in uniq if e["spill_stores"] or e["spill_loads"])
        lines.append(
            f"| {op} | {dtype} | {shapes[(op, dtype)]} | {len(uniq)} "
            f"| {warps[0]}-{warps[-1]} | {min(regs)}-{max(regs)} | {spills} "
            f"| {min(e['resident_warps'] for e in uniq)} |"
        )
    spilling = [e for e in launches.values() if e["spill_stores"] or e["spill_loads"]]
    lines += ["", f"## Launches that spill: {len(spilling)}", ""]
    for e in sorted(spilling, key=lambda e: -e["spill_stores"]):
        lines.append(
            f"- `{e['kernel']}` w{e['num_warps']} {e['constexprs']}: {e['registers']} "
            f"registers, {e['spill_stores']} B stores / {e['spill_loads']} B loads; "
            f"{len(e['uses'])} calls, e.g. {', '.join(' '.join(u) for u in e['uses'][:3])}"
        )
    first = [e for e in launches.values() if e["constexprs"].get("WEIGHT_FIRST")]
    # The rule counts whole programs: resident warps // warps a multiprocessor.
    short = [
        e for e in first
        if e["resident_warps"] // e["num_warps"] < e["rule_resident_warps"] // e["num_warps"]
    ]  # fmt: skip
    counted = sorted({e["rule_resident_warps"] for e in first})
    lines += [
        "",
        "## The norm's weight-first launches against the resident warps the rule counts",
        "",
        f"{len(first)} weight-first launches, counted at {counted} resident warps a "
        f"multiprocessor; {len(short)} hold fewer whole programs than it counts. Registers "
        f"{min((e['registers'] for e in first), default=0)}-"
        f"{max((e['registers'] for e in first), default=0)} a thread; resident warps "
        f"{min((e['resident_warps'] for e in first), default=0)}-"
        f"{max((e['resident_warps'] for e in first), default=0)}.",
    ]
    for e in short:
        lines.append(
            f"- w{e['num_warps']} {e['constexprs']}: {e['registers']} registers, "
            f"{e['resident_warps']} resident warps where the rule counts "
            f"{e['rule_resident_warps']} ({e['rule_resident_warps'] // e['num_warps']} "
            f"programs); e.g. {', '.join(' '.join(u) for u in e['uses'][:3])}"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
