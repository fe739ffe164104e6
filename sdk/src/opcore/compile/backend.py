"""`OpcoreBackend`: a ``torch.compile`` backend that runs the opcore pass pipeline.

    compiled = torch.compile(model, backend=opcore.compile.backend(mode="inductor"))
    compiled = opcore.compile.compile(model, mode="inductor", fusion=True)

Why a backend and not hooks installed into Inductor's global config: the pipeline needs
state per compiled graph (the donated inputs found before AOTAutograd, the compile's config
and its lowering record), the ``eager`` mode must run the same passes without Inductor, and
a backend object leaves other ``torch.compile`` users in the process untouched. Under
``inductor`` the backend still hands the graph to Inductor's ``compile_fx`` with its pass
installed as ``post_grad_custom_pre_pass`` for that call only (a `CustomGraphPass` whose
``uuid()`` is the opcore cache key).

Per graph Dynamo captures (``opcore_ir`` ops are single opaque nodes there):

1. ``maybe_inplace`` -> default overload, donation checked and recorded (before AOTAutograd);
2. AOTAutograd (functional aten graph; ``opcore_ir`` ops still one node each);
3. fusion passes, lowering to the providers dispatch picks under the compile's config
   (``config.compilation.mode`` = the backend's mode, so the platform's per-mode default
   priority applies), clone elimination;
4. ``inductor``: Inductor's own passes and code generation; ``eager``: the FX graph runs
   as Python (Dynamo-only, no code generation), for debugging and for platforms whose
   kernels are all providers.

Compiled graphs check, on each call, whether what their cache key is made of may have
changed since the last call (two compares: the identity of this thread or task's scope
stack, `opcore.scopes.current_scopes()`, and the provider-registry generation). The
graph compiles under the backend's own copy of the config, so `set_current_config` never
changes its key; what can is a `set_priority` block or a registry change. When either
compare fails, the `set_priority` lists in force are compared by value with those the key
was computed for (no key is recomputed when they are equal and the registry did not
change), then the key is computed and, if it moved, the graph compiled again from
Dynamo's capture. The compiled variants are kept per key, so threads or blocks that
alternate between priorities compile each one once. Compilation is for inference: a
graph with ``opcore_ir`` ops whose inputs require grad under grad mode is refused (the ops
have no autograd formula).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import threading
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx

from opcore.compile import opaque
from opcore.compile import record as _record
from opcore.compile.cache_key import cache_key
from opcore.compile.passes import (
    functionalize_inplace,
    fx_utils,
    run_post_aot,
    select_fusion_passes,
)
from opcore.compile.record import CompileRecord
from opcore.ir import all_ops
from opcore.ir.dispatch import PRIORITY_SCOPE, registry_generation
from opcore.ir.priority import MissingPropertyError
from opcore.platforms.kernels import ensure_kernels_loaded
from opcore.scopes import current_scopes

logger = logging.getLogger("opcore.compile")
MODES = ("eager", "inductor")


class CompileError(RuntimeError):
    """The model cannot be compiled by opcore as asked (the message says why)."""


class OpcoreBackend:
    """A ``torch.compile`` backend. ``config``: the `OpcoreConfig` to compile under
    (default: the current one, copied); ``mode``: ``"eager"`` or ``"inductor"`` (default:
    ``config.compilation.mode``); ``fusion``: run the fusion passes (``True``: every
    registered one, ``False``: none, or a collection of pass names: those, in pipeline
    order; see `opcore.compile.FUSION_PASSES`); ``inductor_config``:
    extra Inductor config patches for ``inductor`` mode (e.g. ``{"triton.cudagraphs": True}``).

    ``records``: one `CompileRecord` per graph compiled (recompilations included)."""

    def __init__(
        self,
        config: Any = None,
        *,
        mode: str | None = None,
        fusion: bool | Iterable[str] = True,
        inductor_config: dict[str, Any] | None = None,
    ):
        if config is None:
            from opcore.settings import get_current_config

            config = get_current_config()
        self.config = copy.deepcopy(config)
        if mode is not None:
            if mode not in MODES:
                raise ValueError(f"opcore.compile: mode {mode!r} is not one of {', '.join(MODES)}")
            self.config.compilation.mode = mode
        self.mode = self.config.compilation.mode
        if self.mode not in MODES:
            raise ValueError(
                f"opcore.compile: config.compilation.mode {self.mode!r} is not one of "
                f"{', '.join(MODES)}"
            )
        # a chosen subset is checked now (an unknown name fails here, not at first call);
        # True is resolved per compile, so a pass registered later runs too
        self.fusion_selection: tuple[str, ...] | None = (
            None if isinstance(fusion, bool) else tuple(select_fusion_passes(fusion))
        )
        self.fusion = bool(fusion) if self.fusion_selection is None else True
        self.inductor_config = dict(inductor_config or {})
        self.records: list[CompileRecord] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ public
    def fusion_passes(self) -> list[str]:
        """The fusion passes this backend runs now, in pipeline order."""
        if self.fusion_selection is None:
            return select_fusion_passes(self.fusion)
        return list(self.fusion_selection)

    def cache_key(self) -> str:
        fusion = self.fusion if self.fusion_selection is None else self.fusion_selection
        return cache_key(self.config, mode=self.mode, fusion=fusion)

    @property
    def last_record(self) -> CompileRecord | None:
        return self.records[-1] if self.records else None

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        return CompiledGraph(self, gm, example_inputs)

    def __deepcopy__(self, memo: dict[int, Any]) -> OpcoreBackend:
        # A backend is shared, not copied: transformers deep-copies the generation config
        # whose CompileConfig holds it, and a copy would split `records` from the backend
        # the caller holds (and cannot copy its lock).
        return self

    def __repr__(self) -> str:
        return (
            f"OpcoreBackend(mode={self.mode!r}, fusion={self.fusion}, graphs={len(self.records)})"
        )

    # ------------------------------------------------------------------ compiling
    def compile_graph(
        self, gm: fx.GraphModule, example_inputs: list[Any], key: str
    ) -> tuple[Any, CompileRecord]:
        """Run the pipeline on ``gm`` (modified in place); returns (callable, record)."""
        ensure_kernels_loaded()
        opaque.ensure_all()
        _check_inference(gm)
        record = CompileRecord(
            graph_id=_record.next_graph_id(),
            mode=self.mode,
            fusion=self.fusion,
            cache_key=key,
            priorities=effective_priorities(self.config),
            fusion_passes=self.fusion_passes(),
        )
        record.donated_inputs = functionalize_inplace(gm)
        n_inputs = len(fx_utils.placeholders(gm.graph))
        if self.mode == "eager":
            fn = self._compile_eager(gm, example_inputs, record, n_inputs)
        else:
            fn = self._compile_inductor(gm, example_inputs, record, n_inputs)
        with self._lock:
            self.records.append(record)
        _record.set_last(record)
        logger.debug("opcore.compile:\n%s", record)
        return fn, record

    def _post_aot(self, graph: fx.Graph, record: CompileRecord, n_inputs: int) -> None:
        if len(fx_utils.placeholders(graph)) != n_inputs and record.donated_inputs:
            # Inputs were reordered or lifted differently: the donated indices do not carry over.
            record.clones_kept["*"] = "graph inputs changed through AOTAutograd; donations ignored"
            record.donated_inputs = []
        run_post_aot(graph, record, self.config)

    def _compile_eager(self, gm, example_inputs, record, n_inputs):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def fw_compiler(aot_gm: fx.GraphModule, _inputs: Any) -> Any:
            self._post_aot(aot_gm.graph, record, n_inputs)
            aot_gm.recompile()
            return make_boxed_func(aot_gm.forward)

        return aot_autograd(fw_compiler=fw_compiler)(gm, example_inputs)

    def _compile_inductor(self, gm, example_inputs, record, n_inputs):
        from torch._inductor.compile_fx import compile_fx

        stored_key = _graph_key(record.cache_key, gm)
        post = _make_inductor_pass(self, record, n_inputs)
        patches = {**self.inductor_config, "post_grad_custom_pre_pass": post}
        fn = compile_fx(gm, example_inputs, config_patches=patches)
        if post.ran:
            _record.store(stored_key, record)
        else:  # Inductor's cache served the graph: the passes did not run this time
            cached = _record.load(stored_key)
            record.cache_hit = True
            if cached is not None:
                record.fusions, record.lowered = cached.fusions, cached.lowered
                record.fusion_misses = cached.fusion_misses
                record.clones_removed, record.clones_kept = (
                    cached.clones_removed,
                    cached.clones_kept,
                )
        return fn


def _make_inductor_pass(backend: OpcoreBackend, record: CompileRecord, n_inputs: int):
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class OpcorePostGradPass(CustomGraphPass):
        """opcore's fusion, lowering and clone elimination as Inductor's
        ``post_grad_custom_pre_pass``; ``uuid()`` is the opcore cache key."""

        ran = False

        def __call__(self, graph: fx.Graph) -> None:
            self.ran = True
            backend._post_aot(graph, record, n_inputs)

        def uuid(self) -> str:
            return record.cache_key

    return OpcorePostGradPass()


def _graph_key(key: str, gm: fx.GraphModule) -> str:
    h = hashlib.sha256(key.encode())
    h.update(gm.code.encode())
    for node in fx_utils.placeholders(gm.graph):
        v = fx_utils.fake_value(node)
        if isinstance(v, torch.Tensor):
            h.update(f"{tuple(v.shape)}{v.stride()}{v.dtype}{v.device}".encode())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def effective_priorities(config: Any) -> dict[str, list[str]]:
    """``{op name: the providers tried, in order}`` under ``config`` (and the open
    `set_priority` blocks), for every registered op. An op that no provider of the
    config's required properties serves maps to ``[]``: compiling a graph that does not
    call it still works, and lowering a call of it raises `MissingPropertyError`."""
    out: dict[str, list[str]] = {}
    for name, op in all_ops().items():
        try:
            out[name] = op.effective_priority(config)
        except MissingPropertyError:
            out[name] = []
    return out


def _check_inference(gm: fx.GraphModule) -> None:
    if not torch.is_grad_enabled():
        return
    default, inplace = fx_utils.ir_targets()
    has_ir = any(
        n.op == "call_function" and (n.target in default or n.target in inplace)
        for n in gm.graph.nodes
    )
    if not has_ir:
        return
    for node in fx_utils.placeholders(gm.graph):
        v = fx_utils.fake_value(node)
        if isinstance(v, torch.Tensor) and v.requires_grad:
            raise CompileError(
                f"opcore.compile compiles inference graphs: input %{node.name} requires grad "
                f"while grad mode is on, and opcore_ir ops have no autograd formula. Run the "
                f"model under torch.no_grad() or torch.inference_mode(), or set "
                f"requires_grad=False on its parameters."
            )


class CompiledGraph:
    """What the backend returns to Dynamo for one graph: the compiled callable plus a
    staleness guard (see the module docstring): set_priority lists or provider registry
    changed -> cache key recomputed -> the graph compiled again from Dynamo's capture if
    the key moved (or the variant compiled earlier for that key reused)."""

    _MAX_VARIANTS = 8  # compiled variants kept per graph (one per cache key)
    _MAX_KEYS = 64  # (registry generation, set_priority lists) -> cache key entries kept

    def __init__(self, backend: OpcoreBackend, gm: fx.GraphModule, example_inputs: list[Any]):
        self.backend = backend
        self._original = copy.deepcopy(gm)
        self._tracing_context = torch._guards.TracingContext.try_get()
        self._lock = threading.Lock()
        scopes, gen = current_scopes(), registry_generation()
        key = backend.cache_key()
        fn, self.record = backend.compile_graph(gm, example_inputs, key)
        # registry generation may have moved while compiling (kernels loaded): key on the new one
        gen_after = registry_generation()
        self._keys: dict[tuple, str] = {(gen, _overrides_key(scopes)): key}
        self._variants: dict[str, tuple[Any, CompileRecord]] = {key: (fn, self.record)}
        # (scope stack, registry generation, compiled callable, cache key): one tuple,
        # replaced whole, so a call in another thread reads a consistent one.
        self._state = (scopes, gen if gen == gen_after else -1, fn, key)

    @property
    def cache_key(self) -> str:
        """The cache key of the variant the last call ran."""
        return self._state[3]

    def __call__(self, *args: Any) -> Any:
        # Dynamo calls a backend's result with positional arguments, as AOTAutograd's
        # wrappers (eager and Inductor) expect. The guard: two compares.
        state = self._state
        if state[0] is not current_scopes() or state[1] != registry_generation():
            state = self._refresh()
        return state[2](*args)

    def _refresh(self) -> tuple:
        with self._lock:
            scopes, gen = current_scopes(), registry_generation()
            lookup = (gen, _overrides_key(scopes))
            key = self._keys.get(lookup)
            if key is None:
                key = self.backend.cache_key()
                if len(self._keys) >= self._MAX_KEYS:
                    self._keys.clear()
                self._keys[lookup] = key
            variant = self._variants.get(key)
            if variant is None:
                logger.info(
                    "opcore.compile: configuration or providers changed; recompiling graph %d",
                    self.record.graph_id,
                )
                variant = self._recompile(key)
                if len(self._variants) >= self._MAX_VARIANTS:
                    self._variants.pop(next(iter(self._variants)))
                self._variants[key] = variant
            fn, self.record = variant
            state = (scopes, gen, fn, key)
            self._state = state
            return state

    def _recompile(self, key: str) -> tuple[Any, CompileRecord]:
        gm = copy.deepcopy(self._original)
        fakes = [fx_utils.fake_value(n) for n in fx_utils.placeholders(gm.graph)]
        ctx = self._tracing_context
        if ctx is None:
            raise CompileError(
                "opcore.compile: cannot recompile a graph captured without a tracing context"
            )
        with torch._guards.tracing(ctx):
            return self.backend.compile_graph(gm, fakes, key)


def _overrides_key(scopes: tuple) -> tuple:
    """The `set_priority` lists in force in ``scopes`` (innermost per op), hashable and
    independent of block order. Written without nested Python functions (comprehensions
    included): every Python frame entered under Dynamo's frame hook costs ~1 us."""
    if not scopes:
        return ()
    lists = []
    for frame in scopes:
        if frame.kind == PRIORITY_SCOPE:
            lists.append(frame.value)
    return tuple(sorted(dict(lists).items()))
