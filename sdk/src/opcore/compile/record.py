"""What a compilation did, as plain data: one `CompileRecord` per compiled graph.

A record lists every lowering decision (graph node -> provider, how it was put into the
graph, the priority it was chosen from), which fusions fired, which graph inputs were
donated and which clones were removed. `opcore.compile.last_lowering_record()` returns the
most recent one in this process; a backend keeps all of its own in ``backend.records``.

A fusion pass that finds its pattern but cannot rewrite it says why with
`note_fusion_miss` (the record being built collects it in ``fusion_misses``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any


@dataclasses.dataclass
class LoweringDecision:
    """``node``: the ``opcore_ir`` node's name in the post-AOTAutograd graph. ``how``:
    ``traced`` (the provider's function was traced into aten ops) or ``opaque`` (the
    provider runs as one ``opcore_impl::<op>__<provider>`` call, because tracing it failed
    with ``trace_error``: typically a raw Triton launch, which cannot run on fake tensors).
    ``inplace``: the provider's in-place kernel runs (on clones of the activations, which
    clone elimination drops where safe; under Inductor through ``auto_functionalized``).
    ``form``: for an in-place provider that could not write its activations, why, and
    what ran instead (its out-of-place kernel, or the in-place one on kept clones)."""

    node: str
    op: str
    provider: str
    how: str
    inplace: bool
    priority: list[str]
    trace_error: str | None = None
    form: str | None = None


@dataclasses.dataclass
class CompileRecord:
    """One compiled graph: ``mode`` (``eager``/``inductor``), ``fusion`` (fusion passes
    enabled), ``cache_key`` (see `opcore.compile.cache_key`), ``priorities`` (the effective
    list per op under the compile's config), ``fusions`` (pass name -> times it fired),
    ``donated_inputs`` (graph input indices given to ``maybe_inplace``), ``lowered``,
    ``clones_removed`` / ``clones_kept`` (node names, with the reason a clone was kept)."""

    graph_id: int
    mode: str
    fusion: bool
    cache_key: str
    priorities: dict[str, list[str]]
    fusion_passes: list[str] = dataclasses.field(default_factory=list)
    fusions: dict[str, int] = dataclasses.field(default_factory=dict)
    fusion_misses: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    donated_inputs: list[int] = dataclasses.field(default_factory=list)
    lowered: list[LoweringDecision] = dataclasses.field(default_factory=list)
    clones_removed: list[str] = dataclasses.field(default_factory=list)
    clones_kept: dict[str, str] = dataclasses.field(default_factory=dict)
    cache_hit: bool = False

    def providers(self) -> dict[str, str]:
        """``{node: provider}`` for every lowered node."""
        return {d.node: d.provider for d in self.lowered}

    def by_op(self) -> dict[str, list[str]]:
        """``{op: [provider of each of its nodes, in graph order]}``."""
        out: dict[str, list[str]] = {}
        for d in self.lowered:
            out.setdefault(d.op, []).append(d.provider)
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lines = [
            f"graph {self.graph_id}: mode={self.mode} fusion={self.fusion} "
            f"key={self.cache_key[:16]}"
            + (" (served by Inductor's cache)" if self.cache_hit else ""),
        ]
        if self.fusions:
            lines.append("  fusions: " + ", ".join(f"{k} x{v}" for k, v in self.fusions.items()))
        for name, misses in self.fusion_misses.items():
            lines.extend(f"  not fused ({name}): {why}" for why in misses)
        if self.donated_inputs:
            lines.append(f"  donated inputs: {self.donated_inputs}")
        for d in self.lowered:
            extra = " (in place)" if d.inplace else ""
            if d.form:
                extra += f" ({d.form})"
            lines.append(
                f"  %{d.node}: {d.op} -> {d.provider} [{d.how}]{extra}  priority {d.priority}"
            )
        if self.clones_removed:
            lines.append(f"  clones removed: {', '.join(self.clones_removed)}")
        for name, why in self.clones_kept.items():
            lines.append(f"  clone kept: {name}: {why}")
        return "\n".join(lines)


_collecting: contextvars.ContextVar[CompileRecord | None] = contextvars.ContextVar(
    "opcore_compile_record", default=None
)


@contextlib.contextmanager
def collecting(record: CompileRecord) -> Iterator[CompileRecord]:
    """Inside the block, `note_fusion_miss` writes to ``record`` (the fusion passes run
    in it)."""
    token = _collecting.set(record)
    try:
        yield record
    finally:
        _collecting.reset(token)


def note_fusion_miss(pass_name: str, text: str) -> None:
    """Record that fusion pass ``pass_name`` found its pattern but left it unfused;
    ``text`` names the node and the reason. Outside `collecting` (a pass run by hand) it
    is logged at DEBUG on ``opcore.compile`` only."""
    record = _collecting.get()
    if record is None:
        import logging

        logging.getLogger("opcore.compile").debug("%s: not fused: %s", pass_name, text)
        return
    record.fusion_misses.setdefault(pass_name, []).append(text)


_lock = threading.Lock()
_last: CompileRecord | None = None
_counter = 0


def next_graph_id() -> int:
    global _counter
    with _lock:
        _counter += 1
        return _counter


def set_last(record: CompileRecord) -> None:
    global _last
    with _lock:
        _last = record


_store: dict[str, CompileRecord] = {}


def store(key: str, record: CompileRecord) -> None:
    """Keep ``record`` for a graph Inductor may later serve from its cache (in memory and
    next to Inductor's cache on disk), so a cache hit still reports its lowering."""
    import json
    import os

    with _lock:
        _store[key] = record
    try:
        path = _disk_path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(record.to_dict(), f)
        os.replace(tmp, path)
    except OSError:  # the in-memory copy still serves this process
        pass


def load(key: str) -> CompileRecord | None:
    import json

    with _lock:
        if key in _store:
            return _store[key]
    try:
        with open(_disk_path(key)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    data["lowered"] = [LoweringDecision(**d) for d in data.get("lowered", [])]
    return CompileRecord(**data)


def _disk_path(key: str) -> str:
    import os

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.join(cache_dir(), "opcore_lowering", key[:2], key + ".json")


def last_lowering_record() -> CompileRecord | None:
    """The record of the most recent graph compiled by any opcore backend in this process
    (``None`` before the first)."""
    return _last
