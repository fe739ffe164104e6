"""The fp8 quantization kernels on the current device: correctness, then bandwidth.

``check``: every ``triton`` provider of the eight fp8 ops against the native function
computed on the CPU in float64, over each op's full sample set in fp32/fp16/bf16, plus rows
longer than one register tile: fp8 codes at most the op's declared number of codes apart on
at most its declared fraction of elements (with the conformance suite's small-sample
margin), scales and residual sums within the op's tolerance. Exit status 1 on a miss.

``bench``: each fused kernel against the unfused pair of opcore's own ``triton`` providers
(norm or activation, then the quantization) and ``torch.compile`` (Inductor) of the fused
op's native function, bf16, hidden 4096 (the gated ops: 2 x 14336), at several token
counts. Device time per call from graph replay where the platform captures graphs, else
timing events / wall clock; each figure as achieved bandwidth (the bytes the op must move:
its inputs read once, its outputs written once) and as a percentage of copy bandwidth (a
2 GiB device-to-device ``copy_``, read + write, timed with the platform's events as in
`opcore.bench.timing.copy_bandwidth_gbs`). ``--sweep`` adds the row kernels under several
launch configurations at the largest token count. Performance is recorded, never asserted.

Usage: ``python bench/fp8_kernels.py check|bench [--out DIR] [--tokens 32768,4096,...]
[--quick] [--no-compile] [--no-encoded] [--sweep]``; ``--quick`` (small shapes, few
repetitions) is for testing the plumbing on a CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time

import torch

from opcore.bench.report import write_json
from opcore.kernels import FP8_OPS as QUANT_OPS


def _tensors(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _codes(t):
    bits = t.detach().cpu().contiguous().view(torch.uint8).to(torch.int64).reshape(-1)
    mag = bits & 0x7F
    return torch.where(bits >= 0x80, -mag, mag)


def _allowed_off(numel: int, fraction: float) -> int:
    # the conformance suite's rule (opcore_conformance.tensors.fp8_allowed_off)
    expected = fraction * numel
    return math.ceil(expected + 3.0 * math.sqrt(expected)) if fraction > 0 else 0


# --------------------------------------------------------------------------- check
def _compare_run(where, got, ref, max_codes, fraction, atol, rtol, failures, counts):
    """Compare one run's outputs with the float64 reference; append failures; return the
    running (fp8 values off, fp8 values, peak codes)."""
    off, numel, peak = counts
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        if r is None or g is None:
            if (r is None) != (g is None):
                failures.append(f"{where}: output {i} None mismatch")
            continue
        fp8_out = r.element_size() == 1
        if g.shape != r.shape or (fp8_out or r.dtype == torch.float32) and (g.dtype != r.dtype):
            failures.append(f"{where}: output {i} {g.dtype}{tuple(g.shape)}")
            continue
        r = r if fp8_out else r.to(g.dtype)  # a residual: rounded like the op's
        if g.element_size() == 1:
            # NaN where the reference has NaN is right whatever its sign bit (a kernel's
            # NaN need not carry the input's); NaN against a number is off by 1000
            g_nan = g.detach().cpu().float().isnan().reshape(-1)
            r_nan = r.detach().cpu().float().isnan().reshape(-1)
            steps = (_codes(g) - _codes(r)).abs()
            steps = torch.where(g_nan & r_nan, 0, torch.where(g_nan != r_nan, 1000, steps))
            k = int((steps > 0).sum())
            p = int(steps.max()) if steps.numel() else 0
            off, numel, peak = off + k, numel + steps.numel(), max(peak, p)
            if p > max_codes or k > _allowed_off(steps.numel(), fraction):
                failures.append(f"{where}: {k}/{steps.numel()} off, peak {p}")
        elif not torch.allclose(
            g.detach().cpu().double(), r.double(), atol=atol, rtol=rtol, equal_nan=True
        ):
            err = (g.detach().cpu().double() - r.double()).nan_to_num(float("inf")).abs().max()
            failures.append(f"{where}: output {i} off by {float(err):.3g}")
    return off, numel, peak


@contextlib.contextmanager
def _nothing():
    yield


def _long_rows(dtype):
    """Rows longer than one register tile (the three-pass path) for the row kernels."""
    g = torch.Generator().manual_seed(7)
    n = 20000
    x = torch.randn(3, n, generator=g).to(dtype)
    r = torch.randn(3, n, generator=g).to(dtype)
    w = (1 + torch.randn(n, generator=g) / 4).to(dtype)
    s, ub = torch.tensor([0.02]), torch.tensor([3.0])
    return {
        "rms_norm_dynamic_per_token_quant": (x, w, 1e-6, r, ub),
        "rms_norm_static_fp8_quant": (x, w, 1e-6, s),
        "fused_add_rms_norm_static_fp8_quant": (x, r, w, 1e-6, s),
        "dynamic_per_token_scaled_fp8_quant": (x,),
    }


def check(device, quick: bool, op_names=QUANT_OPS) -> dict:
    from opcore.ir import ops
    from opcore.ir.samples import SampleInput
    from opcore.ir.tolerances import fp8_tolerance
    from opcore.kernels.triton import INTERPRETED as interpreted
    from opcore.kernels.triton import quant
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    failures, rows = [], []
    for name in op_names:
        op = getattr(ops, name)
        impl = op.impls["triton"]
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            max_codes, fraction = fp8_tolerance(name, dtype)
            atol, rtol = op.tolerance(dtype)
            samples = list(op.sample_inputs("cpu", dtype, quick=quick))
            if name in _long_rows(dtype) and not interpreted:  # the interpreter: too slow
                samples.append(SampleInput("long_rows_t3_h20000", _long_rows(dtype)[name]))
            off = numel = peak = cases = 0
            for sample in samples:
                cases += 1
                where = f"{name}/{str(dtype)[6:]}/{sample.name}"
                dev = sample.to(device)
                if not impl.supports_args(*dev.args, **dev.kwargs):
                    failures.append(f"{where}: supports_args rejected")
                    continue
                args64 = [
                    a.double() if isinstance(a, torch.Tensor) and a.dtype == dtype else a
                    for a in sample.args
                ]
                kw64 = {
                    k: v.double() if isinstance(v, torch.Tensor) and v.dtype == dtype else v
                    for k, v in sample.kwargs.items()
                }
                ref = _tensors(op.native(*args64, **kw64))
                # the platform's path (device conversion where it declares the fp8 dtype),
                # then the integer encoding on the same device (the interpreter: encoded)
                runs = []
                for label, forced in (("", None), (" (encoded)", True)):
                    # encoded (the interpreter's only path) in bf16: fewer kernel builds
                    if forced and (interpreted or dtype != torch.bfloat16):
                        continue
                    try:
                        with quant.codes_encoded(forced) if forced else _nothing():
                            runs.append((label, _tensors(impl.functional(*dev.args, **dev.kwargs))))
                        platform.synchronize()
                    except Exception as exc:  # a kernel that fails to build or run is a miss
                        failures.append(f"{where}{label}: {type(exc).__name__}: {exc}"[:400])
                for label, got in runs:
                    off, numel, peak = _compare_run(
                        f"{where}{label}",
                        got,
                        ref,
                        max_codes,
                        fraction,
                        atol,
                        rtol,
                        failures,
                        (off, numel, peak),
                    )
            rows.append(
                {
                    "op": name,
                    "dtype": str(dtype)[6:],
                    "cases": cases,
                    "fp8_off_fraction": off / max(numel, 1),
                    "fp8_peak_codes": peak,
                    "allowed_fraction": fraction,
                }
            )
            print(
                f"{name:40s} {str(dtype)[6:]:9s} {cases:3d} samples: {off}/{numel} fp8 values "
                f"one code off ({100 * off / max(numel, 1):.3f} %, allowed {100 * fraction:g} %)"
            )
    for f in failures:
        print("FAIL", f)
    print(f"fp8 check: {len(failures)} failure(s)")
    return {"device": str(device), "rows": rows, "failures": failures}


# --------------------------------------------------------------------------- bench
def _timer(platform, device):
    """``time(fn, reps) -> seconds per call``: graph replay of ``reps`` calls where the
    platform captures graphs, else timing events or wall clock around a loop."""

    def run(fn, reps: int) -> float:
        for _ in range(3):
            fn()
        platform.synchronize()

        def body():
            for _ in range(reps):
                fn()

        replay = None
        try:
            replay = platform.capture_graph(body)
        except Exception:  # not capturable (a host sync inside): time the eager loop
            replay = None
        step = replay if replay is not None else body
        step()
        platform.synchronize()
        best = math.inf
        for _ in range(3):
            ev = platform.timing_event()
            if ev is not None:
                end = platform.timing_event()
                ev.record()
                step()
                end.record()
                platform.synchronize()
                elapsed = ev.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                step()
                platform.synchronize()
                elapsed = time.perf_counter() - t0
            best = min(best, elapsed / reps)
        return best

    return run


def _cases(tokens: int, hidden: int, inter: int, device):
    """(label, fused op, fused args, unfused (callable, label), bytes moved by the fused op)."""
    from opcore.ir import ops

    bf = torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g).to(device, bf)
    r = torch.randn(tokens, hidden, generator=g).to(device, bf)
    w = (1 + torch.randn(hidden, generator=g) / 4).to(device, bf)
    gated = torch.randn(tokens, 2 * inter, generator=g).to(device, bf)
    s = torch.tensor([0.02], device=device)
    eps = 1e-6

    def t(op_name):
        return getattr(ops, op_name).impls["triton"].functional

    rms, fadd, silu = t("rms_norm"), t("fused_add_rms_norm"), t("silu_and_mul")
    static, dyn, grp = (
        t("scaled_fp8_quant"),
        t("dynamic_per_token_scaled_fp8_quant"),
        t("per_token_group_quant_fp8"),
    )
    n, ng = tokens * hidden, tokens * inter
    scales, gscales = tokens * 4, tokens * (inter // 128) * 4
    return [
        (
            "rms_norm_static_fp8_quant",
            "rms_norm_static_fp8_quant",
            (x, w, eps, s),
            lambda: static(rms(x, w, eps), s),
            "rms_norm + scaled_fp8_quant",
            3 * n,
        ),
        (
            "fused_add_rms_norm_static_fp8_quant",
            "fused_add_rms_norm_static_fp8_quant",
            (x, r, w, eps, s),
            lambda: static(fadd(x, r, w, eps)[0], s),
            "fused_add_rms_norm + scaled_fp8_quant",
            7 * n,
        ),
        (
            "rms_norm_dynamic_per_token_quant",
            "rms_norm_dynamic_per_token_quant",
            (x, w, eps),
            lambda: dyn(rms(x, w, eps)),
            "rms_norm + dynamic_per_token_scaled_fp8_quant",
            3 * n + scales,
        ),
        (
            "rms_norm_dynamic_per_token_quant (residual)",
            "rms_norm_dynamic_per_token_quant",
            (x, w, eps, r),
            lambda: dyn(fadd(x, r, w, eps)[0]),
            "fused_add_rms_norm + dynamic_per_token_scaled_fp8_quant",
            7 * n + scales,
        ),
        (
            "silu_and_mul_fp8_quant",
            "silu_and_mul_fp8_quant",
            (gated, s),
            lambda: static(silu(gated), s),
            "silu_and_mul + scaled_fp8_quant",
            5 * ng,
        ),
        (
            "silu_and_mul_per_token_group_fp8_quant",
            "silu_and_mul_per_token_group_fp8_quant",
            (gated, 128),
            lambda: grp(silu(gated), 128),
            "silu_and_mul + per_token_group_quant_fp8",
            5 * ng + gscales,
        ),
        ("scaled_fp8_quant", "scaled_fp8_quant", (x, s), None, "", 3 * n),
        (
            "dynamic_per_token_scaled_fp8_quant",
            "dynamic_per_token_scaled_fp8_quant",
            (x,),
            None,
            "",
            3 * n + scales,
        ),  # fmt: skip
        (
            "per_token_group_quant_fp8",
            "per_token_group_quant_fp8",
            (x, 128),
            None,
            "",
            3 * n + tokens * (hidden // 128) * 4,
        ),  # fmt: skip
    ]


def _copy_bandwidth(timer, device, nbytes: int, reps: int) -> float:
    """Bytes per second of a device-to-device copy of ``nbytes`` (read + write counted),
    captured in a graph with `_timer`. Only the reference where the platform has no timing
    events: captured in a CUDA graph, the H200's 1 GiB ``copy_`` measured 2710 GB/s, against
    4249 GB/s for `opcore.bench.timing.copy_bandwidth_gbs` outside a graph in the same
    batch of runs (the fused kernels then showed up to 160 % "of copy";
    bench/results/2026-12-01-h200-fp8/)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / timer(lambda: dst.copy_(src), reps)


def _reference_copy(platform, timer, device, nbytes: int, reps: int) -> tuple[float, str]:
    """``(bytes per second, how measured)``: `opcore.bench.timing.copy_bandwidth_gbs` (a 2
    GiB ``copy_`` timed with the platform's events, the reference of every other result
    under bench/results/), else the graph-captured copy (no timing events: the CPU)."""
    from opcore.bench.timing import copy_bandwidth_gbs

    gbs = copy_bandwidth_gbs(platform)
    if gbs is not None:
        return gbs * 1e9, "2 GiB copy_, timing events (opcore.bench.timing)"
    mib = nbytes >> 20
    return _copy_bandwidth(timer, device, nbytes, reps), f"{mib} MiB copy_, graph or clock"


# The row kernels' launch configurations timed by ``--sweep`` (rows per program, warps), at
# hidden 4096 (one register tile of 4096 columns; the heuristic: 1 row on 8 warps).
SWEEP_CONFIGS = ((1, 4), (1, 8), (1, 16), (2, 8), (2, 16), (4, 16))
SWEEP_OPS = (
    "rms_norm_static_fp8_quant",
    "rms_norm_dynamic_per_token_quant",
    "dynamic_per_token_scaled_fp8_quant",
)


# `silu_and_mul_fp8_quant`'s output tiles timed by ``--sweep`` (columns, rows, warps,
# columns first), at intermediate 14336: the heuristic's (`_launch.elementwise_params`:
# 2048 x 2 on 8 warps, a 2-D grid), the gated activation's (`_launch.gated_params`: 1024 x 2
# on 8 warps, columns first) and neighbours in both orders.
SWEEP_GATED = (
    (2048, 2, 8, 0),
    (1024, 2, 8, 1),
    (1024, 2, 8, 0),
    (2048, 1, 8, 1),
    (2048, 2, 8, 1),
    (1024, 1, 4, 1),
    (2048, 1, 4, 1),
    (1024, 4, 8, 1),
    (512, 4, 4, 1),
    (4096, 1, 8, 1),
)


def sweep_gated(timer, tokens: int, inter: int, reps: int, copy_bw: float, device) -> list[dict]:
    """`silu_and_mul_fp8_quant` (the fused kernel behind torch.compile on the H100 run of
    2026-12-05) under each of `SWEEP_GATED` (`quant.static_launch`): time, % of copy and
    fp8 codes that differ from the heuristic's output (an elementwise kernel: none may)."""
    from opcore.ir import ops
    from opcore.kernels.triton import quant

    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, 2 * inter, generator=g).to(device, torch.bfloat16)
    s = torch.tensor([0.02], device=device)
    fn = ops.silu_and_mul_fp8_quant.impls["triton"].functional
    base = _codes(_tensors(fn(x, s))[0])
    rows = []
    for block_c, n_rows, warps, cols_first in SWEEP_GATED:
        row = {"case": "silu_and_mul_fp8_quant", "tokens": tokens, "block_c": block_c,
               "rows": n_rows, "num_warps": warps, "cols_first": cols_first}  # fmt: skip
        try:
            with quant.static_launch(block_c, n_rows, warps, bool(cols_first)):
                codes = _codes(_tensors(fn(x, s))[0])
                t = timer(lambda: fn(x, s), reps)
        except Exception as exc:  # a configuration that fails to build: recorded
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            print(f"sweep silu_and_mul_fp8_quant {block_c}x{n_rows} warps={warps} "
                  f"cols_first={cols_first} {row['error']}")  # fmt: skip
            continue
        row.update(
            us=t * 1e6,
            pct_copy=100 * 5 * tokens * inter / t / copy_bw,
            codes_off=int((codes != base).sum()),
            peak_codes=int((codes - base).abs().max()),
        )
        rows.append(row)
        print(
            f"sweep silu_and_mul_fp8_quant {block_c:5d} x {n_rows} warps={warps:2d} "
            f"cols_first={cols_first} {row['us']:8.1f} us ({row['pct_copy']:5.1f} % copy), "
            f"{row['codes_off']} codes off"
        )
    return rows


def sweep(timer, tokens: int, hidden: int, reps: int, copy_bw: float, device) -> list[dict]:
    """Each of `SWEEP_OPS` (no residual: the two fused kernels that missed 85 % of copy on
    the first H200 run, and the plain per-token quant on the same kernel) under each of
    `SWEEP_CONFIGS` (`quant.row_launch`): time, % of copy, and fp8 codes that differ from
    the heuristic's output (the sum of squares is ordered by the launch; at most one code
    apart is the ops' tolerance)."""
    from opcore.ir import ops
    from opcore.kernels.triton import quant

    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g).to(device, torch.bfloat16)
    w = (1 + torch.randn(hidden, generator=g) / 4).to(device, torch.bfloat16)
    s = torch.tensor([0.02], device=device)
    args = {
        "rms_norm_static_fp8_quant": (x, w, 1e-6, s),
        "rms_norm_dynamic_per_token_quant": (x, w, 1e-6),
        "dynamic_per_token_scaled_fp8_quant": (x,),
    }
    nbytes = {
        "rms_norm_static_fp8_quant": 3 * tokens * hidden,
        "rms_norm_dynamic_per_token_quant": 3 * tokens * hidden + 4 * tokens,
        "dynamic_per_token_scaled_fp8_quant": 3 * tokens * hidden + 4 * tokens,
    }
    rows = []
    for name in SWEEP_OPS:
        fn = getattr(ops, name).impls["triton"].functional
        a = args[name]
        base = _codes(_tensors(fn(*a))[0])
        for n_rows, warps in SWEEP_CONFIGS:
            if n_rows * _next_pow2(hidden) > 16384:
                continue
            row = {"case": name, "tokens": tokens, "rows": n_rows, "num_warps": warps}
            try:
                with quant.row_launch(n_rows, warps):
                    codes = _codes(_tensors(fn(*a))[0])
                    t = timer(lambda f=fn, a=a: f(*a), reps)
            except Exception as exc:  # a configuration that fails to build: recorded
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
                print(f"sweep {name:36s} rows={n_rows} warps={warps:2d} {row['error']}")
                continue
            steps = (codes - base).abs()
            row.update(
                us=t * 1e6,
                pct_copy=100 * nbytes[name] / t / copy_bw,
                codes_off=int((steps > 0).sum()),
                peak_codes=int(steps.max()),
            )
            rows.append(row)
            print(
                f"sweep {name:36s} rows={n_rows} warps={warps:2d} {row['us']:8.1f} us "
                f"({row['pct_copy']:5.1f} % copy), {row['codes_off']} codes off the "
                f"heuristic's (peak {row['peak_codes']})"
            )
    return rows


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def bench(
    device,
    token_counts,
    hidden: int,
    inter: int,
    reps: int,
    compile_native: bool,
    encoded: bool = True,
    do_sweep: bool = False,
    save=None,
):
    from opcore.ir import ops
    from opcore.kernels.triton import INTERPRETED, quant
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    timer = _timer(platform, device)
    gib = 1 << 30 if device.type != "cpu" else 1 << 24
    copy_bw, copy_how = _reference_copy(platform, timer, device, gib, max(1, reps // 4))
    print(f"copy bandwidth: {copy_bw / 1e9:.0f} GB/s (read + write; {copy_how})")
    copy_graph = None
    if device.type != "cpu":  # the graph-captured copy, for the record (see _copy_bandwidth)
        copy_graph = _copy_bandwidth(timer, device, gib, max(1, reps // 4)) / 1e9
        print(f"copy in a graph (memcpy node): {copy_graph:.0f} GB/s (not the reference)")
    compiled = {}
    rows = []
    for tokens in token_counts:
        for label, op_name, args, unfused, unfused_label, nbytes in _cases(
            tokens, hidden, inter, device
        ):
            op = getattr(ops, op_name)
            row = {"case": label, "tokens": tokens, "bytes": nbytes}
            fused = op.impls["triton"].functional
            t_fused = timer(lambda f=fused, a=args: f(*a), reps)
            row["triton_us"] = t_fused * 1e6
            row["triton_pct_copy"] = 100 * nbytes / t_fused / copy_bw
            if encoded and tokens == max(token_counts) and not INTERPRETED:
                # the same kernel encoding the codes in integer arithmetic (the path of a
                # device without fp8 conversions): what converting saves
                with quant.codes_encoded(True):
                    t_enc = timer(lambda f=fused, a=args: f(*a), reps)
                row["encoded_us"] = t_enc * 1e6
                row["encoded_pct_copy"] = 100 * nbytes / t_enc / copy_bw
            if unfused is not None:
                t_unf = timer(unfused, reps)
                row["unfused_us"] = t_unf * 1e6
                row["unfused"] = unfused_label
                row["speedup_vs_unfused"] = t_unf / t_fused
            if compile_native and unfused is not None:  # the fused ops (compile is slow)
                try:
                    fn = compiled.get(label)
                    if fn is None:
                        fn = compiled[label] = torch.compile(op.native)
                    for a in args:  # the token dim, on every activation (shared symbol)
                        if isinstance(a, torch.Tensor) and a.dim() >= 2:
                            torch._dynamo.mark_dynamic(a, 0)
                    t_c = timer(lambda f=fn, a=args: f(*a), reps)
                    row["compile_us"] = t_c * 1e6
                    row["compile_pct_copy"] = 100 * nbytes / t_c / copy_bw
                    row["speedup_vs_compile"] = t_c / t_fused
                except Exception as exc:  # record why, keep the other figures
                    row["compile_error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            print(
                f"{label:45s} T={tokens:6d} triton {row['triton_us']:9.1f} us "
                f"({row['triton_pct_copy']:5.1f} % copy)"
                + (
                    f"  unfused {row['unfused_us']:9.1f} us (x{row['speedup_vs_unfused']:.2f})"
                    if "unfused_us" in row
                    else ""
                )
                + (
                    f"  compile {row['compile_us']:9.1f} us ({row['compile_pct_copy']:5.1f} %)"
                    if "compile_us" in row
                    else ""
                )
            )
    result = {"device": str(device), "copy_gbps": copy_bw / 1e9, "copy_how": copy_how,
              "copy_graph_gbps": copy_graph, "hidden": hidden, "intermediate": inter,
              "rows": rows, "sweep": []}  # fmt: skip
    if do_sweep:
        if save is not None:  # the table so far, in case the sweep runs out of time
            save(result)
        # The gated kernel's tiles first: the row kernels' six settings are the longer part.
        result["sweep_gated"] = sweep_gated(timer, max(token_counts), inter, reps, copy_bw, device)
        if save is not None:
            save(result)
        result["sweep"] = sweep(timer, max(token_counts), hidden, reps, copy_bw, device)
    return result


def _markdown(result: dict) -> str:
    lines = [
        f"# fp8 kernels on {result['device']}",
        "",
        f"copy bandwidth {result['copy_gbps']:.0f} GB/s ({result['copy_how']}); "
        f"bf16, hidden {result['hidden']}, "
        f"gated ops 2 x {result['intermediate']}; device time per call (graph replay where "
        f"available); % of copy bandwidth = the op's minimum bytes / time / copy bandwidth.",
        "",
        "| case | tokens | triton us | % copy | unfused pair us | fused speedup | "
        "torch.compile us | compile % copy | vs compile |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['case']} | {r['tokens']} | {r['triton_us']:.1f} | {r['triton_pct_copy']:.1f} "
            f"| {r.get('unfused_us', float('nan')):.1f} | "
            f"{r.get('speedup_vs_unfused', float('nan')):.2f} | "
            f"{r.get('compile_us', float('nan')):.1f} | "
            f"{r.get('compile_pct_copy', float('nan')):.1f} | "
            f"{r.get('speedup_vs_compile', float('nan')):.2f} |"
        )
    encoded = [r for r in result["rows"] if "encoded_us" in r]
    if encoded:
        lines += [
            "",
            "The same kernels encoding the fp8 codes in integer arithmetic instead of the "
            "device's conversion (the path of a device without fp8 conversions):",
            "",
            "| case | tokens | converted us | % copy | encoded us | % copy |",
            "|---|---|---|---|---|---|",
        ]
        for r in encoded:
            lines.append(
                f"| {r['case']} | {r['tokens']} | {r['triton_us']:.1f} | "
                f"{r['triton_pct_copy']:.1f} | {r['encoded_us']:.1f} | "
                f"{r['encoded_pct_copy']:.1f} |"
            )
    if result.get("sweep"):
        lines += [
            "",
            "Launch configurations of the row kernels (`quant.row_launch`; the heuristic: "
            "1 row per program, 8 warps at 4096 columns); codes off = fp8 values that differ "
            "from the heuristic's output:",
            "",
            "| case | tokens | rows | warps | us | % copy | codes off (peak) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in result["sweep"]:
            if "error" in r:
                lines.append(
                    f"| {r['case']} | {r['tokens']} | {r['rows']} | {r['num_warps']} | "
                    f"{r['error']} | | |"
                )
                continue
            lines.append(
                f"| {r['case']} | {r['tokens']} | {r['rows']} | {r['num_warps']} | "
                f"{r['us']:.1f} | {r['pct_copy']:.1f} | {r['codes_off']} ({r['peak_codes']}) |"
            )
    if result.get("sweep_gated"):
        lines += [
            "",
            "Output tiles of `silu_and_mul_fp8_quant` (`quant.static_launch`; the heuristic: "
            "2048 columns x 2 rows, 8 warps, a 2-D grid at intermediate 14336; columns first: "
            "the 1-D grid of the gated activations):",
            "",
            "| tokens | columns | rows | warps | columns first | us | % copy | codes off (peak) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in result["sweep_gated"]:
            head = (
                f"| {r['tokens']} | {r['block_c']} | {r['rows']} | {r['num_warps']} | "
                f"{r.get('cols_first', 0)} | "
            )
            if "error" in r:
                lines.append(head + f"{r['error']} | | |")
            else:
                lines.append(
                    head + f"{r['us']:.1f} | {r['pct_copy']:.1f} | "
                    f"{r['codes_off']} ({r['peak_codes']}) |"
                )
    errors = [r for r in result["rows"] if "compile_error" in r]
    for r in errors:
        lines.append(f"\ntorch.compile failed for {r['case']} (T={r['tokens']}): "
                     f"{r['compile_error']}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["check", "bench"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--tokens", default="32768,8192,1024,64")
    ap.add_argument("--quick", action="store_true", help="small shapes (CPU plumbing test)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile of native")
    ap.add_argument(
        "--no-encoded", action="store_true", help="bench: skip the integer-encoded timings"
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="bench: also time the row kernels' launch configurations at the largest count",
    )
    ap.add_argument("--ops", default=",".join(QUANT_OPS), help="check: these ops only")
    args = ap.parse_args(argv)
    import opcore.kernels.triton  # noqa: F401  (registers provider "triton")
    from opcore.platforms import get_current_platform

    device = get_current_platform().device()
    if device.type == "cpu" and not opcore.kernels.triton.INTERPRETED:
        print("no Triton device here: run with TRITON_INTERPRET=1 (and --quick) on a CPU")
        return 2
    if args.what == "check":
        names = [n for n in args.ops.split(",") if n]
        bad = sorted(set(names) - set(QUANT_OPS))
        if bad:
            print(f"unknown op(s) {bad}; known: {', '.join(QUANT_OPS)}")
            return 2
        result = check(device, args.quick, names)
        status = 1 if result["failures"] else 0
    else:
        tokens = [int(t) for t in args.tokens.split(",")]
        opts = {"encoded": not args.no_encoded, "do_sweep": args.sweep, "save": None}
        if args.out:
            opts["save"] = lambda r: _save(args.out, "fp8_bench", r, _markdown(r))
        if args.quick:
            result = bench(device, [16, 64], 256, 256, 2, not args.no_compile, **opts)
        else:
            result = bench(device, tokens, 4096, 14336, 20, not args.no_compile, **opts)
        status = 0
    if args.out:
        suffix = "" if args.what == "bench" or args.ops == ",".join(QUANT_OPS) else "_" + args.ops
        md = _markdown(result) if args.what == "bench" else None
        _save(args.out, f"fp8_{args.what}{suffix}", result, md)
    return status


def _save(out: str, stem: str, result: dict, md: str | None) -> None:
    """``out/stem.json`` and, given ``md``, ``out/fp8_bench.md``."""
    os.makedirs(out, exist_ok=True)
    write_json(result, os.path.join(out, f"{stem}.json"))
    if md is not None:
        with open(os.path.join(out, "fp8_bench.md"), "w") as f:
            f.write(md)


if __name__ == "__main__":
    sys.exit(main())
