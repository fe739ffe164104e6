"""Decode-step benchmark: a small Llama-shaped decoder run with the platform's providers
and with native only, eagerly and as one CUDA graph.

Model: 8 layers, hidden 4096, 32 q / 8 kv heads of 128, intermediate 14336, bf16 (the
Llama-3-8B layer shapes, 8 of its 32 layers). Each layer: fused add + RMSNorm, QKV
projection, rotary on the q/k slices, attention, output projection, fused add +
RMSNorm, gate/up projection, SiLU-and-mul, down projection; a final RMSNorm. The norms,
activation and rotary are `opcore.layers` RMSNorm, SiluAndMul and RotaryEmbedding (which
call the ops' default, non-mutating overloads); projections are plain matmuls. With
``--direct-ops`` the same step calls the ops instead, donating activations through
``maybe_inplace`` (in-place residual add + norm and rotary): the form the 2026-11-29 H200
results in bench/results/ were measured with.

Attention reads the new tokens' queries over a fixed, pre-filled KV context (``--context``
tokens, GQA), identical in both runs; the KV cache is not written. ``--attention sdpa``
(the benchmark's default) runs it as `F.scaled_dot_product_attention`, a stand-in for the
attention backend; ``--attention opcore`` runs the backend the platform selects
(`opcore.attention`) over a paged copy of the same context.

Run: ``python bench/decode_step.py [--batch 1,8,32] [--out DIR]`` on the platform's device.
Prints a table and writes ``decode_step.json`` / ``decode_step.md``.

Batch invariance (docs/properties.md): ``OPCORE_BATCH_INVARIANT=1 python
bench/decode_step.py --batch-invariance 32 [--out DIR]`` decodes a batch of 32 sequences
(each its own token and KV context) and each of 4 of them alone, and checks that every
sequence's output is bitwise the same both ways; it writes ``batch_invariance.json`` /
``.md`` with the step's cost in that mode relative to the default mode. Its attention is
opcore's backend (``--attention opcore``), which takes the required properties from the
config (TRITON_PAGED fixes its split count). The projections are not opcore's: cuBLAS
chooses its kernels from the row count, so in this check they run at a fixed 32 rows (zero
rows added, results sliced back), which makes them batch-invariant; the table separates
that cost from the cost of opcore's batch-invariant providers. (With ``--attention sdpa``
the SDPA stand-in is padded the same way; it is not deterministic on the H200: see
``--trace-repeat``.)

``--trace-repeat N`` runs the step three times per mode and names the first sub-step
whose bits differ between runs (`trace_repeat`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch
import torch.nn.functional as F

from opcore.bench.report import write_json

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD, INTER = 4096, 8, 32, 8, 128, 14336
OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding")


class Decoder:
    """The decoder's weights and one decode step over ``batch`` new tokens.

    ``pad_rows``: run the projections and the attention stand-in at that many rows
    (zero rows added, results sliced back), so that the kernels torch picks for them do
    not change with the batch size (the batch-invariance check)."""

    pad_rows: int | None = None

    def __init__(
        self,
        batch: int,
        context: int,
        device,
        dtype=torch.bfloat16,
        seed: int = 0,
        use_layers: bool = True,
        attention: str = "sdpa",
    ):
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*shape, scale):  # drawn on the device: the CPU would take seconds for 3.5 GB
            return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

        qkv_out = (HEADS + 2 * KV_HEADS) * HEAD
        self.layers = [
            {
                "in_norm": w(HIDDEN, scale=0.1) + 1,
                "qkv": w(HIDDEN, qkv_out, scale=HIDDEN**-0.5),
                "o": w(HEADS * HEAD, HIDDEN, scale=HIDDEN**-0.5),
                "post_norm": w(HIDDEN, scale=0.1) + 1,
                "gate_up": w(HIDDEN, 2 * INTER, scale=HIDDEN**-0.5),
                "down": w(INTER, HIDDEN, scale=INTER**-0.5),
                "k_ctx": w(batch, KV_HEADS, context, HEAD, scale=1.0),
                "v_ctx": w(batch, KV_HEADS, context, HEAD, scale=1.0),
            }
            for _ in range(LAYERS)
        ]
        self.final_norm = w(HIDDEN, scale=0.1) + 1
        inv = 1.0 / (500000.0 ** (torch.arange(0, HEAD, 2, dtype=torch.float32) / HEAD))
        f = torch.arange(context + 64, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos_sin = torch.cat([f.cos(), f.sin()], -1).to(device)
        self.positions = torch.full((batch,), context, dtype=torch.int64, device=device)
        self.x = w(batch, HIDDEN, scale=1.0)
        self.batch = batch
        self.use_layers = use_layers
        self.attention = attention
        if use_layers:
            self._build_layers(context, device, dtype)
        if attention == "opcore":
            self._build_paged_kv(batch, context, device, dtype)

    def _build_layers(self, context: int, device, dtype) -> None:
        from opcore.layers import RMSNorm, RotaryEmbedding, SiluAndMul

        def norm(weight):
            m = RMSNorm(HIDDEN, 1e-5, dtype=dtype).to(device)
            m.weight.data.copy_(weight)
            return m

        for p in self.layers:
            p["in_norm_layer"], p["post_norm_layer"] = norm(p["in_norm"]), norm(p["post_norm"])
        self.final_norm_layer = norm(self.final_norm)
        self.rope = RotaryEmbedding(
            HEAD, HEAD, max_position=context + 64, rope_theta=500000.0, is_neox=True
        ).to(device)
        self.act = SiluAndMul()

    BLOCK = 16  # tokens per KV block of the paged cache (``--attention opcore``)

    def _build_paged_kv(self, batch: int, context: int, device, dtype) -> None:
        """``--attention opcore``: the backend the platform selects for these heads, each
        layer's KV context copied into that backend's paged cache (sequence i in blocks
        ``i * blocks_per_seq ...``), and the batch's metadata (built once, outside the step:
        the forward itself does no host work)."""
        from opcore.attention import AttentionSelectorConfig, select_backend

        cfg = AttentionSelectorConfig(
            head_size=HEAD,
            num_heads=HEADS,
            num_kv_heads=KV_HEADS,
            dtype=dtype,
            block_size=self.BLOCK,
            device_type=device.type,
        )
        self.attn_cls = select_backend(cfg).backend_cls
        self.attn_impls: dict = {}
        per_seq = -(-context // self.BLOCK)
        self.block_table = torch.arange(batch * per_seq, device=device, dtype=torch.int32).view(
            batch, per_seq
        )
        for p in self.layers:
            cache = self.attn_cls.allocate_kv_cache(
                batch * per_seq, self.BLOCK, KV_HEADS, HEAD, dtype, device
            )
            key_cache, value_cache = self._attn_impl().split_kv_cache(cache)
            for src, dst in ((p["k_ctx"], key_cache), (p["v_ctx"], value_cache)):
                # [batch, kv heads, context, head] -> blocks of [BLOCK, kv heads, head]
                t = src.new_zeros((batch, per_seq * self.BLOCK, KV_HEADS, HEAD))
                t[:, :context] = src.transpose(1, 2)
                dst.copy_(t.view(batch * per_seq, self.BLOCK, KV_HEADS, HEAD))
            p["kv_cache"] = cache
        self.context = context
        self._build_metadata(torch.arange(batch, device=device))

    def _build_metadata(self, index: torch.Tensor) -> None:
        from opcore.attention import PagedAttentionMetadata

        n = index.numel()
        device = self.block_table.device
        self.attn_md = PagedAttentionMetadata.build(
            torch.arange(n + 1, device=device, dtype=torch.int32),
            torch.full((n,), self.context, device=device, dtype=torch.int32),
            self.block_table.index_select(0, index),
        )

    def _attn_impl(self):
        """The backend instance for the current config's required properties (a backend may
        settle its launch choices from them when built: TRITON_PAGED fixes its split count
        when batch invariance is required)."""
        from opcore.settings import get_current_config

        key = tuple(sorted(get_current_config().kernel.required_properties))
        impl = self.attn_impls.get(key)
        if impl is None:
            impl = self.attn_impls[key] = self.attn_cls(HEADS, HEAD, KV_HEADS, HEAD**-0.5)
        return impl

    def sequences(self, rows: list[int], pad_rows: int | None = None) -> Decoder:
        """A decoder over sequences ``rows`` of this one (same weights, their tokens, KV
        contexts and positions), with ``pad_rows``."""
        other = object.__new__(Decoder)
        other.__dict__.update(self.__dict__)
        other.pad_rows = pad_rows
        index = torch.tensor(rows, device=self.x.device)
        other.x = self.x.index_select(0, index)
        other.positions = self.positions.index_select(0, index)
        other.batch = len(rows)
        other.layers = [
            {
                **p,
                "k_ctx": p["k_ctx"].index_select(0, index),
                "v_ctx": p["v_ctx"].index_select(0, index),
            }
            for p in self.layers
        ]
        if self.attention == "opcore":
            # The paged caches are shared; the rows' block tables select their sequences.
            other._build_metadata(index)
        else:
            other._pad_ctx()
        return other

    def _pad_ctx(self) -> None:
        """With ``pad_rows``: the KV contexts padded with zero sequences, once."""
        if self.pad_rows is None:
            return
        for p in self.layers:
            for name in ("k_ctx", "v_ctx"):
                t = p[name][: self.batch]
                padded = t.new_zeros((self.pad_rows, *t.shape[1:]))
                padded[: self.batch] = t
                p[name] = padded

    def _mm(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.pad_rows is None:
            return h @ w
        padded = h.new_zeros((self.pad_rows, h.shape[1]))
        padded[: h.shape[0]] = h
        return (padded @ w)[: h.shape[0]]

    def _attention(self, q: torch.Tensor, p: dict) -> torch.Tensor:
        b = q.shape[0]
        if self.attention == "opcore":
            out = self._attn_impl().forward(q.reshape(b, HEADS, HEAD), p["kv_cache"], self.attn_md)
            return out.reshape(b, HEADS * HEAD)
        rows = self.pad_rows or b
        qh = q.new_zeros((rows, HEADS * HEAD)) if self.pad_rows else q
        if self.pad_rows:
            qh[:b] = q
        attn = F.scaled_dot_product_attention(
            qh.reshape(rows, HEADS, 1, HEAD), p["k_ctx"], p["v_ctx"], enable_gqa=True
        )
        return attn.reshape(rows, HEADS * HEAD)[:b]

    def step(self) -> torch.Tensor:
        return self.step_layers() if self.use_layers else self.step_ops()

    # ``--trace-repeat``: a list receiving (name, fn, inputs, output) of every sub-step, so
    # two runs can be compared intermediate by intermediate; None: plain calls.
    trace: list | None = None

    def _call(self, name: str, fn, *args):
        out = fn(*args)
        if self.trace is not None:
            keep = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
            outs = out if isinstance(out, tuple) else (out,)
            self.trace.append((name, fn, tuple(keep(a) for a in args), [keep(o) for o in outs]))
        return out

    def step_layers(self) -> torch.Tensor:
        c = self._call
        h = self.x.clone()
        residual = torch.zeros_like(h)
        for i, p in enumerate(self.layers):
            h, residual = c(f"{i}.in_norm", p["in_norm_layer"], h, residual)
            qkv = c(f"{i}.qkv_proj", self._mm, h, p["qkv"])
            q, k = qkv[:, : HEADS * HEAD], qkv[:, HEADS * HEAD : (HEADS + KV_HEADS) * HEAD]
            q, k = c(f"{i}.rotary", self.rope, self.positions, q, k)
            a = c(f"{i}.attention", self._attention, q, p)
            h = c(f"{i}.o_proj", self._mm, a, p["o"])
            h, residual = c(f"{i}.post_norm", p["post_norm_layer"], h, residual)
            gu = c(f"{i}.gate_up_proj", self._mm, h, p["gate_up"])
            h = c(f"{i}.down_proj", self._mm, c(f"{i}.silu_and_mul", self.act, gu), p["down"])
        out, _ = c("final_norm", self.final_norm_layer, h, residual)
        return out

    def step_ops(self) -> torch.Tensor:
        from opcore.ir import ops

        b = self.batch
        h = self.x.clone()
        residual = torch.zeros_like(h)
        for p in self.layers:
            h, residual = ops.fused_add_rms_norm.maybe_inplace(h, residual, p["in_norm"], 1e-5)
            qkv = h @ p["qkv"]
            q, k = qkv[:, : HEADS * HEAD], qkv[:, HEADS * HEAD : (HEADS + KV_HEADS) * HEAD]
            q, k = ops.rotary_embedding.maybe_inplace(
                self.positions, q, k, HEAD, self.cos_sin, True
            )
            # attention stand-in: new queries over the fixed KV context (see module docstring)
            qh = q.reshape(b, HEADS, 1, HEAD)
            attn = F.scaled_dot_product_attention(qh, p["k_ctx"], p["v_ctx"], enable_gqa=True)
            h = attn.reshape(b, HEADS * HEAD) @ p["o"]
            h, residual = ops.fused_add_rms_norm.maybe_inplace(h, residual, p["post_norm"], 1e-5)
            h = ops.silu_and_mul(h @ p["gate_up"]) @ p["down"]
        out, _ = ops.fused_add_rms_norm.maybe_inplace(h, residual, self.final_norm, 1e-5)
        return out


@contextlib.contextmanager
def native_only():
    from opcore.ir import ops

    with contextlib.ExitStack() as stack:
        for name in OPS:
            stack.enter_context(getattr(ops, name).set_priority(["native"]))
        yield


def providers_used() -> dict[str, str]:
    from opcore.ir import ops

    return {name: ",".join(getattr(ops, name).effective_priority()) for name in OPS}


def time_eager(fn, device) -> float:
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=20, rep=300, return_mode="median")) * 1e3
    fn()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return sorted(samples)[len(samples) // 2] * 1e6


def time_graph(fn, device) -> float | None:
    if device.type != "cuda":
        return None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    import triton.testing

    return (
        float(triton.testing.do_bench(graph.replay, warmup=20, rep=300, return_mode="median")) * 1e3
    )


PROBE_SEQUENCES = (0, 7, 19, 31)  # sequences of the batch also decoded alone


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.shape == b.shape and torch.equal(a.view(view), b.view(view))


def attention_name(model: Decoder) -> str:
    """The attention the step runs, for reports."""
    if model.attention != "opcore":
        return "F.scaled_dot_product_attention"
    impl = model._attn_impl()
    props = ",".join(sorted(impl.declared_properties()))
    splits = getattr(impl, "num_splits", None)
    return f"{impl.name}" + (f", num_splits={splits}" if splits else "") + f", declares {props}"


def _standins_repeat(model: Decoder) -> dict[str, bool]:
    """Whether the non-opcore parts of the step (the first layer's projections and the SDPA
    stand-in) give the same bits twice on the same inputs: tells their run-to-run
    variation from opcore's providers'."""
    p = model.layers[0]
    g = torch.Generator(device=model.x.device).manual_seed(1)
    h = torch.randn(model.x.shape, generator=g, device=model.x.device).to(model.x.dtype)
    q = torch.randn((model.batch, HEADS * HEAD), generator=g, device=model.x.device).to(
        model.x.dtype
    )
    return {
        "qkv_matmul": _bits_equal(model._mm(h, p["qkv"]), model._mm(h, p["qkv"])),
        "gate_up_matmul": _bits_equal(model._mm(h, p["gate_up"]), model._mm(h, p["gate_up"])),
        "attention": _bits_equal(model._attention(q, p), model._attention(q, p)),
    }


def _time(fn, device) -> float:
    """Graph replay on CUDA (launch gaps removed), else the eager median (µs)."""
    t = time_graph(fn, device)
    return t if t is not None else time_eager(fn, device)


def batch_invariance(args, platform, device) -> int:
    """``--batch-invariance N``: see the module docstring. Returns the exit status (1 when
    a sequence's bits differ between alone and in the batch)."""
    from opcore.settings import create_config, get_current_config, set_current_config

    n = args.batch_invariance
    from_env = "batch_invariant" in get_current_config().kernel.required_properties
    bi_config = create_config(
        required_properties=sorted(
            set(get_current_config().kernel.required_properties) | {"batch_invariant"}
        )
    )
    default_config = create_config(required_properties=[])
    model = Decoder(
        n, args.context, device, use_layers=not args.direct_ops, attention=args.attention
    )
    padded = model.sequences(list(range(n)), pad_rows=n)
    probes = [j for j in PROBE_SEQUENCES if j < n]
    results: dict[str, dict] = {}
    for mode, config in (("batch_invariant", bi_config), ("default", default_config)):
        with set_current_config(config):
            full = padded.step()
            again = padded.step()
            # A third run tells a first-call effect (compilation, autotuning, lazily built
            # tables) from run-to-run variation: runs 2 and 3 both come after warm-up.
            third = padded.step()
            differ = [
                j
                for j in probes
                if not _bits_equal(full[j], padded.sequences([j], pad_rows=n).step()[0])
            ]
            results[mode] = {
                "providers": providers_used(),
                "attention": attention_name(padded),
                "sequences_checked": probes,
                "differ_alone_vs_batch": differ,
                "repeat_bitwise_equal": _bits_equal(full, again),
                "repeat_after_warmup_bitwise_equal": _bits_equal(again, third),
                f"padded_batch{n}_us": _time(padded.step, device),
                "padded_batch1_us": _time(padded.sequences([0], pad_rows=n).step, device),
            }
            if mode == "default":
                results[mode][f"plain_batch{n}_us"] = _time(model.step, device)
                results[mode]["plain_batch1_us"] = _time(model.sequences([0]).step, device)
    bi, df = results["batch_invariant"], results["default"]
    standins = _standins_repeat(padded)
    # The criterion: alone vs in the batch, bitwise; and run-to-run after warm-up.
    ok = not bi["differ_alone_vs_batch"] and bi["repeat_after_warmup_bitwise_equal"]
    timer = "CUDA-graph replay" if device.type == "cuda" else "eager median"
    lines = [
        f"# decode step batch invariance: one sequence alone vs inside a batch of {n}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, platform {platform.name}, "
        f"device {device}, torch {torch.__version__}, dims hidden {HIDDEN} x {LAYERS} layers, "
        f"{'opcore.layers' if not args.direct_ops else 'ops'}; times: {timer}",
        "",
        f"- OPCORE_BATCH_INVARIANT set in the environment: {from_env} "
        f"(the batch-invariant mode is entered through the config either way)",
        f"- batch-invariant mode: sequences {probes} decoded alone "
        + (
            "are bitwise identical to the same sequences in the batch"
            if not bi["differ_alone_vs_batch"]
            else f"DIFFER for sequences {bi['differ_alone_vs_batch']}"
        )
        + f"; repeat runs bitwise equal: {bi['repeat_bitwise_equal']} (first vs second run), "
        f"{bi['repeat_after_warmup_bitwise_equal']} (second vs third)",
        f"- default mode (for comparison): sequences differing alone vs batch: "
        f"{df['differ_alone_vs_batch'] or 'none'}; repeat runs bitwise equal: "
        f"{df['repeat_bitwise_equal']} (first vs second), "
        f"{df['repeat_after_warmup_bitwise_equal']} (second vs third)",
        f"- attention: batch-invariant mode {bi['attention']}; default mode {df['attention']}",
        f"- the first layer's projections and attention alone at {n} rows, two runs on the "
        f"same inputs bitwise equal: {json.dumps(standins)}",
        f"- providers, batch-invariant mode: {json.dumps(bi['providers'])}",
        f"- providers, default mode: {json.dumps(df['providers'])}",
        "",
        "| step | batch 1 µs | batch " + str(n) + " µs |",
        "|---|---:|---:|",
        f"| default providers, plain stand-ins (the usual step) | {df['plain_batch1_us']:.1f} "
        f"| {df[f'plain_batch{n}_us']:.1f} |",
        f"| default providers, stand-ins at {n} rows | {df['padded_batch1_us']:.1f} "
        f"| {df[f'padded_batch{n}_us']:.1f} |",
        f"| batch-invariant providers, stand-ins at {n} rows | {bi['padded_batch1_us']:.1f} "
        f"| {bi[f'padded_batch{n}_us']:.1f} |",
        "",
        "opcore's cost of the mode: row 3 / row 2 "
        f"(batch 1: {bi['padded_batch1_us'] / df['padded_batch1_us']:.3f}x, batch {n}: "
        f"{bi[f'padded_batch{n}_us'] / df[f'padded_batch{n}_us']:.3f}x); the whole mode "
        f"against the usual step: row 3 / row 1 (batch 1: "
        f"{bi['padded_batch1_us'] / df['plain_batch1_us']:.3f}x, batch {n}: "
        f"{bi[f'padded_batch{n}_us'] / df[f'plain_batch{n}_us']:.3f}x)",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_json(
            {"ok": ok, "batch": n, "from_env": from_env, "standins_repeat": standins} | results,
            os.path.join(args.out, "batch_invariance.json"),
        )
        with open(os.path.join(args.out, "batch_invariance.md"), "w") as f:
            f.write(text)
    return 0 if ok else 1


def _bits_differ_rows(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many rows (first dim) of ``a`` and ``b`` differ bitwise."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    ne = a.view(view) != b.view(view)
    return int(ne.reshape(ne.shape[0], -1).any(1).sum()) if ne.dim() else int(ne)


def _state(model: Decoder) -> dict[str, torch.Tensor]:
    """Every tensor the step reads besides activations: weights, KV contexts, caches."""
    out = {"x": model.x, "positions": model.positions, "rope.cache": model.rope.cos_sin_cache}
    for i, p in enumerate(model.layers):
        for k, v in p.items():
            if isinstance(v, torch.Tensor):
                out[f"{i}.{k}"] = v
            elif isinstance(v, torch.nn.Module):
                out.update({f"{i}.{k}.{n}": t for n, t in v.state_dict().items()})
    return out


def traced_runs(model: Decoder, n: int) -> list[list]:
    """``n`` runs of ``model``'s step, each run's trace (every sub-step's name, callable,
    inputs and outputs, in order)."""
    runs = []
    try:
        for _ in range(n):
            model.trace = []
            model.step()
            runs.append(model.trace)
    finally:
        model.trace = None
    return runs


def _compare_runs(a: list, b: list) -> dict | None:
    """The first sub-step whose output differs between traces ``a`` and ``b``, whether its
    inputs were equal, and what replaying it on ``a``'s inputs gives."""
    for (name, fn, args_a, outs_a), (_, _, args_b, outs_b) in zip(a, b, strict=True):
        diff = [_bits_differ_rows(x, y) for x, y in zip(outs_a, outs_b, strict=True)]
        if not any(diff):
            continue
        inputs_equal = all(
            _bits_equal(x, y)
            for x, y in zip(args_a, args_b, strict=True)
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        )
        replays = []
        for _ in range(3):
            r = fn(*args_a)
            r = r if isinstance(r, tuple) else (r,)
            replays.append([o.clone() for o in r])
        return {
            "sub_step": name,
            "rows_differing_per_output": diff,
            "rows": int(outs_a[0].shape[0]),
            "inputs_bitwise_equal": inputs_equal,
            "replay_on_first_inputs_equals_first_output": all(
                _bits_equal(x, y) for x, y in zip(replays[0], outs_a, strict=True)
            ),
            "replays_equal_each_other": all(
                _bits_equal(x, y) for r in replays[1:] for x, y in zip(replays[0], r, strict=True)
            ),
            "differing_sub_steps": sum(
                1
                for (_, _, _, oa), (_, _, _, ob) in zip(a, b, strict=True)
                if any(_bits_differ_rows(x, y) for x, y in zip(oa, ob, strict=True))
            ),
        }
    return None


def trace_repeat(args, device) -> int:
    """``--trace-repeat N``: the step at batch N (plain, and with the stand-ins at N rows)
    run three times in each mode, every sub-step's output kept; reports the first sub-step
    whose bits differ between runs, whether its inputs were equal (a kernel that varies on
    fixed inputs) or not (the variation came from earlier), what a replay on the first run's
    inputs gives, and whether any weight, KV context or cache changed across the runs (a
    stray write). Exit status 1 when any run differs."""
    from opcore.settings import create_config, set_current_config

    n = args.trace_repeat
    model = Decoder(n, args.context, device, attention=args.attention)
    padded = model.sequences(list(range(n)), pad_rows=n)
    single = model.sequences([0])
    report: dict[str, dict] = {}
    modes = (
        ("default", create_config(required_properties=[])),
        ("batch_invariant", create_config(required_properties=["batch_invariant"])),
    )
    for mode, config in modes:
        with set_current_config(config):
            for label, m in (("plain", model), ("padded", padded), ("alone", single)):
                before = {k: v.clone() for k, v in _state(m).items()}
                runs = traced_runs(m, 3)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                changed = [k for k, v in _state(m).items() if not _bits_equal(v, before[k])]
                report[f"{mode}/{label}"] = {
                    "providers": providers_used(),
                    "attention": attention_name(m),
                    "run1_vs_run2": _compare_runs(runs[0], runs[1]),
                    "run2_vs_run3": _compare_runs(runs[1], runs[2]),
                    "state_changed": changed,
                }
                del runs, before
    bad = any(r["run1_vs_run2"] or r["run2_vs_run3"] or r["state_changed"] for r in report.values())
    text = json.dumps(report, indent=1)
    print(text)
    print("verdict:", "runs DIFFER" if bad else "every run bitwise equal, no state changed")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"trace_repeat-{args.attention}.json"), "w") as f:
            f.write(text)
    return 1 if bad else 0


def _tiny() -> None:
    """Small dimensions, for a dry run of the plumbing on the CPU."""
    global HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD, INTER
    HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD, INTER = 256, 2, 4, 2, 64, 512


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,8,32", help="decode batch sizes (new tokens per step)")
    ap.add_argument(
        "--context", type=int, default=1024, help="KV context length of the attention stand-in"
    )
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="directory for decode_step.json / .md")
    ap.add_argument(
        "--direct-ops",
        action="store_true",
        help="call the ops with maybe_inplace instead of the opcore.layers modules",
    )
    ap.add_argument(
        "--batch-invariance",
        type=int,
        default=None,
        metavar="N",
        help="check that sequences decoded alone and in a batch of N give the same bits "
        "(in batch-invariant mode) and record the mode's cost; see the module docstring",
    )
    ap.add_argument(
        "--trace-repeat",
        type=int,
        default=None,
        metavar="N",
        help="run the step at batch N three times per mode and report the first sub-step "
        "whose bits differ between runs (see trace_repeat)",
    )
    ap.add_argument(
        "--attention",
        choices=("sdpa", "opcore"),
        default=None,
        help="the step's attention: 'sdpa' (F.scaled_dot_product_attention stand-in; the "
        "benchmark's default) or 'opcore' (the backend the platform selects, over a paged KV "
        "cache; the default of --batch-invariance and --trace-repeat)",
    )
    ap.add_argument("--tiny", action="store_true", help="small dimensions (a CPU dry run)")
    args = ap.parse_args(argv)
    if args.attention is None:
        checks = args.batch_invariance is not None or args.trace_repeat is not None
        args.attention = "opcore" if checks else "sdpa"
    if args.tiny:
        _tiny()

    from opcore.ir import ensure_kernels_loaded
    from opcore.platforms import get_current_platform

    platform = get_current_platform()
    device = torch.device(args.device) if args.device else platform.device()
    ensure_kernels_loaded()
    if args.trace_repeat is not None:
        with torch.inference_mode():
            return trace_repeat(args, device)
    if args.batch_invariance is not None:
        with torch.inference_mode():
            return batch_invariance(args, platform, device)
    rows = []
    with torch.inference_mode():
        for batch in [int(b) for b in args.batch.split(",")]:
            model = Decoder(batch, args.context, device, use_layers=not args.direct_ops)
            ref = model.step()
            with native_only():
                nat = model.step()
                native_providers = providers_used()
                t_native_eager = time_eager(model.step, device)
                t_native_graph = time_graph(model.step, device)
            err = ((ref.float() - nat.float()).norm() / nat.float().norm()).item()
            t_prov_eager = time_eager(model.step, device)
            t_prov_graph = time_graph(model.step, device)
            row = {
                "batch": batch,
                "context": args.context,
                "providers": providers_used(),
                "native": native_providers,
                "rel_diff_providers_vs_native": err,
                "native_eager_us": t_native_eager,
                "native_graph_us": t_native_graph,
                "providers_eager_us": t_prov_eager,
                "providers_graph_us": t_prov_graph,
                "speedup_eager": t_native_eager / t_prov_eager,
            }
            if t_native_graph:
                row["speedup_graph"] = t_native_graph / t_prov_graph
                row["speedup_providers_graph_vs_native_eager"] = t_native_eager / t_prov_graph
            rows.append(row)
            del model
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "platform": platform.name,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "form": "ops via maybe_inplace" if args.direct_ops else "opcore.layers",
    }
    lines = [
        "# decode step: 8 layers, hidden 4096, 32/8 heads x 128, intermediate 14336, bf16",
        "",
        ", ".join(f"{k}: {v}" for k, v in env.items()),
        "",
        "attention: SDPA stand-in over a fixed KV context (identical in both runs)",
        "",
        "| batch | native eager µs | providers eager µs | × eager | native graph µs "
        "| providers graph µs | × graph | providers graph vs native eager | rel. diff |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        g = r["native_graph_us"] is not None
        lines.append(
            f"| {r['batch']} | {r['native_eager_us']:.1f} | {r['providers_eager_us']:.1f} | "
            f"{r['speedup_eager']:.2f} | {r['native_graph_us']:.1f} | "
            f"{r['providers_graph_us']:.1f} | "
            f"{r['speedup_graph']:.2f} | {r['speedup_providers_graph_vs_native_eager']:.2f} | "
            f"{r['rel_diff_providers_vs_native']:.1e} |"
            if g
            else f"| {r['batch']} | {r['native_eager_us']:.1f} | {r['providers_eager_us']:.1f} | "
            f"{r['speedup_eager']:.2f} | | | | | {r['rel_diff_providers_vs_native']:.1e} |"
        )
    lines.append("")
    lines.append("providers: " + json.dumps(rows[0]["providers"]) if rows else "")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_json({"environment": env, "rows": rows}, os.path.join(args.out, "decode_step.json"))
        with open(os.path.join(args.out, "decode_step.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
