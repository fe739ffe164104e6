"""FP8 decode step: a Llama-shaped decoder with FP8 linear layers, compiled three ways.

The sibling of ``bench/decode_step.py`` for quantized models. Every linear layer runs
``torch._scaled_mm`` on e4m3 weights (per-tensor weight scales) and an e4m3 activation:

- QKV, o-proj and gate/up inputs: per-token dynamic scales
  (``dynamic_per_token_scaled_fp8_quant``; ``--norm-quant static``: a fixed per-tensor
  scale for the two norms' outputs, ``scaled_fp8_quant``);
- down-proj input: a fixed per-tensor scale (``scaled_fp8_quant``), as checkpoints with
  static activation scales do; per-tensor scales on both sides of that GEMM.

Each layer is written unfused, the way a model author writes it with ``opcore.layers``:
``RMSNorm`` (residual add + norm) then a quantization, ``RotaryEmbedding`` on the q/k
slices, attention, ``SiluAndMul`` then a quantization. Attention is a stand-in, as in
``decode_step.py``: SDPA of the new tokens over a fixed KV context (GQA), the same in
every variant; it is not what is measured.

Variants (same weights, same inputs):
  ``torch.compile``        the model written with the ops' native functions, plain
                           ``torch.compile`` (Inductor sees aten ops only);
  ``opcore``               ``opcore.compile`` (Inductor) without fusion: each op lowered
                           to the provider the platform's priority picks;
  ``opcore+fusion``        the same with every fusion pass: norm + quant ->
                           ``rms_norm_dynamic_per_token_quant`` (or
                           ``fused_add_rms_norm_static_fp8_quant``), SiLU-and-mul + quant ->
                           ``silu_and_mul_fp8_quant``;
  ``opcore+fusion-noquant`` (``--variants``) the fusion passes without the quantization ones,
                           to separate their share.

The token dim is compiled dynamic (Dynamo's automatic dynamic shapes: batch 1, then one
graph for the larger batches), so each variant compiles about twice. On a GPU every
variant runs under CUDA graphs. Timing: median of ``--repeats`` timings of ``--iters``
steps (CUDA events around the loop; wall clock on the CPU).

Correctness: each variant's output at each batch (third call) against the uncompiled model
written with the native functions (``eager native``): relative L2 difference, FAIL above
``--max-rel-diff`` (default 0.15). Compiled code legitimately differs from eager at the
percent level: Inductor keeps fp32 between the ops it fuses where eager rounds to bf16,
and the fused ops quantize the fp32 value; either flips some e4m3 roundings by one step,
and the layers carry the flips on (3-4 % with 2 tiny layers on the CPU, for plain
``torch.compile`` as for the fused variant). A wrong kernel or a wrong fusion is far
above that. The ``opcore+fusion`` variant must also fire the quantization fusions
expected per layer, else FAIL.

CPU: ``--small`` (tiny shapes). Where ``torch._scaled_mm`` cannot run on the device the
script says so and puts a dequantizing matmul in its place: the graph structure (what the
passes fuse) and the numerics of everything else are still checked, the timings are not
FP8 GEMMs.

Usage: python bench/fp8_decode_step.py --out DIR [--small] [--batch 1,8,32,128]
Writes DIR/fp8_decode_step.json and .md (after every variant, so a run cut short keeps
what it measured) and exits 1 when any check FAILs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from opcore.bench.report import write_json

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
VARIANTS = ("torch.compile", "opcore", "opcore+fusion", "opcore+fusion-noquant")
DEFAULT_VARIANTS = VARIANTS[:3]


@dataclasses.dataclass
class Shape:
    layers: int = 8
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head: int = 128
    inter: int = 14336
    context: int = 1024

    @classmethod
    def small(cls) -> Shape:
        return cls(layers=2, hidden=128, heads=4, kv_heads=2, head=32, inter=256, context=16)


def scaled_mm_reason(device: torch.device) -> str | None:
    """Why ``torch._scaled_mm`` (row-wise and per-tensor scales) cannot run here, or None."""
    try:
        a = torch.ones(16, 32, device=device).to(FP8)
        b = torch.ones(16, 32, device=device).to(FP8)
        one = torch.ones((), device=device)
        torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        torch._scaled_mm(
            a,
            b.t(),
            scale_a=torch.ones(16, 1, device=device),
            scale_b=torch.ones(1, 16, device=device),
            out_dtype=torch.bfloat16,
        )
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def _dequant_mm(q, w, scale_a, scale_b, out_dtype):
    """Stand-in for ``torch._scaled_mm`` where it cannot run (see the module docstring)."""
    return ((q.float() * scale_a) @ (w.float() * scale_b)).to(out_dtype)


class Weights:
    """FP8 weights (``[out, in]`` e4m3, per-tensor scale) and the fixed context, shared by
    every variant."""

    def __init__(self, s: Shape, device, dtype, seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)

        def randn(*shape):
            return torch.randn(*shape, generator=g, device=device)

        def linear(out_f, in_f):
            w = randn(out_f, in_f) * in_f**-0.5
            scale = w.abs().max() / FP8_MAX
            return (w / scale).to(FP8), scale.float()

        qkv_out = (s.heads + 2 * s.kv_heads) * s.head
        self.layers = []
        for _ in range(s.layers):
            p = {}
            for name, (o, i) in {
                "qkv": (qkv_out, s.hidden),
                "o": (s.hidden, s.heads * s.head),
                "gate_up": (2 * s.inter, s.hidden),
                "down": (s.hidden, s.inter),
            }.items():
                p[name], p[name + "_scale"] = linear(o, i)
                # row-wise form of the per-tensor scale, for GEMMs with per-token activations
                p[name + "_scale_row"] = p[name + "_scale"].expand(1, o).contiguous()
            p["in_norm"] = (1 + 0.1 * randn(s.hidden)).to(dtype)
            p["post_norm"] = (1 + 0.1 * randn(s.hidden)).to(dtype)
            p["kv"] = randn(2, s.kv_heads, s.context, s.head).to(dtype)
            self.layers.append(p)
        self.final_norm = (1 + 0.1 * randn(s.hidden)).to(dtype)
        # fixed activation scales (as calibrated checkpoints carry): normalized rows stay
        # within ~8, the gated activation within ~16, of e4m3's 448
        self.norm_scale = torch.tensor(8.0 / FP8_MAX, device=device)
        self.down_scale = torch.tensor(16.0 / FP8_MAX, device=device)


class Fp8Decoder(nn.Module):
    """``forward(positions [T], x [T, hidden]) -> [T, hidden]``: one decode step of T new
    tokens. ``impl="opcore"``: `opcore.layers` and the `opcore.ir` quantization ops (one
    node each under torch.compile); ``impl="native"``: their native functions."""

    def __init__(
        self,
        s: Shape,
        w: Weights,
        impl: str,
        dtype,
        device,
        norm_quant: str = "dynamic",
        scaled_mm: bool = True,
    ):
        super().__init__()
        from opcore.ir import ops
        from opcore.layers import RMSNorm, RotaryEmbedding, SiluAndMul

        if impl not in ("opcore", "native"):
            raise ValueError(f"impl must be 'opcore' or 'native', got {impl!r}")
        self.s, self.w, self.impl, self.dtype = s, w, impl, dtype
        self.static_norm_quant = norm_quant == "static"
        self.mm = torch._scaled_mm if scaled_mm else _dequant_mm

        def pick(op):
            return op if impl == "opcore" else op.native

        self.dyn_quant = pick(ops.dynamic_per_token_scaled_fp8_quant)
        self.static_quant = pick(ops.scaled_fp8_quant)
        self.add_norm = ops.fused_add_rms_norm.native
        self.rotary = ops.rotary_embedding.native
        self.silu = ops.silu_and_mul.native

        def norm(weight):
            m = RMSNorm(s.hidden, 1e-5, dtype=dtype).to(device)
            m.weight.requires_grad_(False)
            m.weight.data.copy_(weight)
            return m

        self.norms = nn.ModuleList(
            nn.ModuleList([norm(p["in_norm"]), norm(p["post_norm"])]) for p in w.layers
        )
        self.final = norm(w.final_norm)
        self.rope = RotaryEmbedding(
            s.head, s.head, max_position=s.context + 64, rope_theta=500000.0, is_neox=True
        ).to(device)
        self.act = SiluAndMul()

    def _norm(self, layer: nn.Module, h, residual):
        if self.impl == "opcore":
            return layer(h, residual)
        return self.add_norm(h, residual, layer.weight, layer.variance_epsilon)

    def _norm_quant(self, h):
        if self.static_norm_quant:
            return self.static_quant(h, self.w.norm_scale), None
        return self.dyn_quant(h)

    def _linear(self, q, scale, p, name):
        if scale is None:  # per-tensor activation scale: per-tensor on both sides
            return self.mm(
                q, p[name].t(), self.w.norm_scale, p[name + "_scale"], out_dtype=self.dtype
            )
        return self.mm(q, p[name].t(), scale, p[name + "_scale_row"], out_dtype=self.dtype)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        s = self.s
        t = x.shape[0]
        h, residual = x, torch.zeros_like(x)
        for p, (in_norm, post_norm) in zip(self.w.layers, self.norms, strict=True):
            h, residual = self._norm(in_norm, h, residual)
            q, scale = self._norm_quant(h)
            qkv = self._linear(q, scale, p, "qkv")
            qs, ks = qkv[:, : s.heads * s.head], qkv[:, s.heads * s.head : -s.kv_heads * s.head]
            if self.impl == "opcore":
                qs, ks = self.rope(positions, qs, ks)
            else:
                qs, ks = self.rotary(positions, qs, ks, s.head, self.rope.cos_sin_cache, True)
            # attention stand-in: the new queries over the fixed context (module docstring)
            ck = p["kv"][0].unsqueeze(0).expand(t, -1, -1, -1)
            cv = p["kv"][1].unsqueeze(0).expand(t, -1, -1, -1)
            attn = F.scaled_dot_product_attention(
                qs.reshape(t, s.heads, 1, s.head), ck, cv, enable_gqa=True
            ).reshape(t, s.heads * s.head)
            q, scale = self.dyn_quant(attn)
            h = self._linear(q, scale, p, "o")
            h, residual = self._norm(post_norm, h, residual)
            q, scale = self._norm_quant(h)
            gate_up = self._linear(q, scale, p, "gate_up")
            a = self.act(gate_up) if self.impl == "opcore" else self.silu(gate_up)
            q = self.static_quant(a, self.w.down_scale)
            h = self.mm(q, p["down"].t(), self.w.down_scale, p["down_scale"], out_dtype=self.dtype)
        out, _ = self._norm(self.final, h, residual)
        return out


def expected_fusions(s: Shape, norm_quant: str) -> dict[str, int]:
    norm_pass = (
        "fuse_add_rms_norm_static_fp8_quant"
        if norm_quant == "static"
        else "fuse_add_rms_norm_dynamic_per_token_quant"
    )
    return {norm_pass: 2 * s.layers, "fuse_silu_and_mul_fp8_quant": s.layers}


def build(variant: str, s: Shape, w: Weights, args, device, dtype):
    import opcore.compile as oc

    impl = "native" if variant == "torch.compile" else "opcore"
    model = Fp8Decoder(s, w, impl, dtype, device, args.norm_quant, args.scaled_mm).eval()
    if variant == "torch.compile":
        return torch.compile(model, mode="reduce-overhead" if args.cudagraphs else None), None
    if variant == "opcore":
        fusion: bool | list[str] = False
    elif variant == "opcore+fusion":
        fusion = True
    else:
        fusion = [n for n in oc.FUSION_PASSES if n not in oc.QUANT_FUSION_PASSES]
    be = oc.backend(
        args.config,
        mode="inductor",
        fusion=fusion,
        inductor_config={"triton.cudagraphs": True} if args.cudagraphs else None,
    )
    return torch.compile(model, backend=be), be


def time_ms(fn, device, iters: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(end) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / iters)
    return statistics.median(samples)


def _inputs(s: Shape, batch: int, device, dtype):
    g = torch.Generator(device=device).manual_seed(batch)
    positions = torch.full((batch,), s.context, dtype=torch.int64, device=device)
    x = torch.randn(batch, s.hidden, generator=g, device=device).to(dtype)
    return positions, x


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def run_variant(variant, s, w, args, device, dtype, references) -> dict:
    torch._dynamo.reset()
    compiled, be = build(variant, s, w, args, device, dtype)
    out: dict = {"variant": variant, "batches": {}}
    t_compile = 0.0
    for batch in args.batch:
        positions, x = _inputs(s, batch, device, dtype)
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(3):  # compile (or reuse the dynamic graph), warm up, record graphs
                y = compiled(positions, x)
            t_compile += time.perf_counter() - t0
            y = y.float().clone()
            ms = time_ms(
                lambda c=compiled, p=positions, h=x: c(p, h), device, args.iters, args.repeats
            )
        diff = rel_diff(y, references[batch])
        out["batches"][batch] = {"ms": ms, "rel_diff": diff, "ok": diff <= args.max_rel_diff}
    out["compile_and_warmup_s"] = round(t_compile, 2)
    if be is not None:
        out["graphs"] = len(be.records)
        rec = be.last_record
        if rec is not None:
            out["lowered"] = {op: sorted(set(p)) for op, p in rec.by_op().items()}
            out["fusions"] = dict(rec.fusions)
            out["fusion_misses"] = dict(rec.fusion_misses)
        if variant == "opcore+fusion":
            want = expected_fusions(s, args.norm_quant)
            got = {k: out.get("fusions", {}).get(k, 0) for k in want}
            out["fusions_expected"] = want
            out["fusions_ok"] = got == want
    return out


def failures(result: dict) -> list[str]:
    fails = []
    for v in result["variants"]:
        for batch, r in v["batches"].items():
            if not r["ok"]:
                fails.append(
                    f"{v['variant']} at batch {batch}: rel. diff {r['rel_diff']:.3g} vs eager "
                    f"native > {result['max_rel_diff']}"
                )
        if v.get("fusions_ok") is False:
            fails.append(
                f"{v['variant']}: fusions {v.get('fusions')} (expected {v['fusions_expected']}); "
                f"misses: {v.get('fusion_misses')}"
            )
    return fails


def markdown(result: dict) -> str:
    env, s = result["environment"], result["shape"]
    lines = ["# FP8 decode step compiled three ways", ""]
    fails = failures(result)
    if fails:
        lines += [f"**FAIL ({len(fails)}):**", ""] + [f"- {f}" for f in fails] + [""]
    if result["scaled_mm_missing"]:
        lines += [
            f"**torch._scaled_mm does not run on {env['device']}** "
            f"({result['scaled_mm_missing']}): a dequantizing matmul stands in for it. The "
            "graph structure (fusions) and numerics are checked; the timings are not FP8 GEMMs.",
            "",
        ]
    lines += [
        f"{env['date']}; device {env.get('gpu') or env['device']}; platform `{env['platform']}`; "
        f"torch {env['torch']}; triton {env['triton']}; opcore {env['opcore']}",
        "",
        f"{s['layers']} layers, hidden {s['hidden']}, heads {s['heads']}/{s['kv_heads']} x "
        f"{s['head']}, MLP {s['inter']}, context {s['context']}; {result['dtype']} activations, "
        f"e4m3 weights (per-tensor scales); norm outputs quantized "
        f"{'per tensor (static)' if result['norm_quant'] == 'static' else 'per token (dynamic)'}"
        f", down-proj input per tensor (static); CUDA graphs "
        f"{'on' if result['cudagraphs'] else 'off'}. Median ms per step.",
        "",
    ]
    variants = result["variants"]
    names = [v["variant"] for v in variants]
    base = next((v for v in variants if v["variant"] == "torch.compile"), None)
    fused = next((v for v in variants if v["variant"] == "opcore+fusion"), None)
    if base and fused:  # the headline: what the fusion passes give over plain compile
        gains = [
            f"batch {b} {base['batches'][b]['ms'] / fused['batches'][b]['ms']:.2f}x"
            for b in result["batch"]
            if b in base["batches"] and b in fused["batches"]
        ]
        lines += [
            "**opcore+fusion vs plain torch.compile** (speed-up: torch.compile ms / "
            "opcore+fusion ms; above 1 the fusion passes are faster): " + ", ".join(gains),
            "",
        ]
    head = "| batch | " + " | ".join(f"{n} ms" for n in names)
    head += "".join(
        f" | {n} speed-up vs torch.compile" for n in names if base and n != "torch.compile"
    )
    lines += [head + " |", "|---:" * (1 + len(names) + (len(names) - 1 if base else 0)) + "|"]
    for batch in result["batch"]:
        cells = [str(batch)]
        for v in variants:
            r = v["batches"].get(batch)
            cells.append(f"{r['ms']:.4f}" if r else "")
        if base:
            b = base["batches"].get(batch)
            for v in variants:
                if v is base:
                    continue
                r = v["batches"].get(batch)
                cells.append(f"{b['ms'] / r['ms']:.3f}x" if r and b else "")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Accuracy, not time: relative L2 difference of the step's output vs the "
        f"uncompiled native model (third call); FAIL above "
        f"{result['max_rel_diff']}:",
        "",
        "| batch | " + " | ".join(names) + " |",
        "|---:" * (1 + len(names)) + "|",
    ]
    for batch in result["batch"]:
        cells = [str(batch)]
        for v in variants:
            r = v["batches"].get(batch)
            cells.append(f"{r['rel_diff']:.2e}{'' if r['ok'] else ' **FAIL**'}" if r else "")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for v in variants:
        if "lowered" not in v:
            continue
        lowered = ", ".join(f"{op} -> {'/'.join(p)}" for op, p in v["lowered"].items())
        lines.append(
            f"- {v['variant']}: {v.get('graphs')} graph(s), compile + warm-up "
            f"{v['compile_and_warmup_s']} s; fusions {json.dumps(v.get('fusions', {}))}; "
            f"lowering: {lowered}"
        )
        for name, misses in v.get("fusion_misses", {}).items():
            lines.append(
                f"  - not fused ({name}): {misses[0]}"
                + (f" (+{len(misses) - 1})" if len(misses) > 1 else "")
            )
    return "\n".join(lines) + "\n"


def environment(device: torch.device) -> dict:
    import opcore
    from opcore.platforms import get_current_platform

    env = {
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        "device": str(device),
        "torch": torch.__version__,
        "opcore": opcore.__version__,
        "platform": get_current_platform().name,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for fp8_decode_step.json / .md")
    ap.add_argument("--small", action="store_true", help="tiny shapes (CPU plumbing)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batch", type=_ints, default=None, help="default 1,8,32,128 (small: 1,4)")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"of {VARIANTS}")
    ap.add_argument("--norm-quant", choices=("dynamic", "static"), default="dynamic")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--max-rel-diff",
        type=float,
        default=0.15,
        help="FAIL above this relative L2 difference vs eager native (see the docstring)",
    )
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--no-cudagraphs", dest="cudagraphs", action="store_false")
    ap.add_argument(
        "--priority",
        default=None,
        help="provider priority for every op, e.g. triton,native (default: the platform's)",
    )
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")

    from opcore.ir import all_ops, ensure_kernels_loaded

    ensure_kernels_loaded()
    missing = [
        n for n in ("scaled_fp8_quant", "dynamic_per_token_scaled_fp8_quant") if n not in all_ops()
    ]
    if missing:
        print(f"fp8_decode_step: ops {missing} are not registered in this opcore", file=sys.stderr)
        return 2
    args.config = None
    if args.priority:
        from opcore.settings import create_config

        names = [p.strip() for p in args.priority.split(",") if p.strip()]
        if "triton" in names:
            import opcore.kernels.triton  # noqa: F401  (registered on demand off the GPU platforms)
        args.config = create_config(ir_op_priority={op: names for op in all_ops()})

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.cudagraphs = args.cudagraphs and device.type == "cuda"
    dtype = torch.bfloat16
    s = Shape.small() if args.small else Shape()
    if args.layers:
        s.layers = args.layers
    args.batch = args.batch or ([1, 4] if args.small else [1, 8, 32, 128])
    args.iters = args.iters or (3 if args.small else 20)
    reason = scaled_mm_reason(device)
    args.scaled_mm = reason is None
    if reason:
        print(
            f"torch._scaled_mm cannot run on {device} ({reason}): a dequantizing matmul "
            "stands in; graph structure and numerics only",
            flush=True,
        )

    w = Weights(s, device, dtype)
    reference = Fp8Decoder(s, w, "native", dtype, device, args.norm_quant, args.scaled_mm)
    references = {}
    with torch.inference_mode():
        for batch in args.batch:
            references[batch] = reference(*_inputs(s, batch, device, dtype)).float()
    del reference
    result = {
        "environment": environment(device),
        "shape": dataclasses.asdict(s),
        "dtype": str(dtype).removeprefix("torch."),
        "norm_quant": args.norm_quant,
        "cudagraphs": args.cudagraphs,
        "priority": args.priority,
        "batch": args.batch,
        "max_rel_diff": args.max_rel_diff,
        "scaled_mm_missing": reason,
        "variants": [],
    }
    os.makedirs(args.out, exist_ok=True)
    for variant in variants:
        row = run_variant(variant, s, w, args, device, dtype, references)
        result["variants"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "lowered"}), flush=True)
        result["failures"] = failures(result)
        write_json(result, os.path.join(args.out, "fp8_decode_step.json"))
        with open(os.path.join(args.out, "fp8_decode_step.md"), "w") as f:
            f.write(markdown(result))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(markdown(result))
    for line in failures(result):
        print(f"FAIL: {line}", file=sys.stderr)
    return 1 if failures(result) else 0


if __name__ == "__main__":
    sys.exit(main())
