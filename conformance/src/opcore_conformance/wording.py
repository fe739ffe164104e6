"""Internal positions said in words, for failure messages a plugin author reads.

``out[1]`` becomes "the 2nd returned tensor"; a layer's call form becomes the call itself,
``forward(x, residual)``, named by the parameters of the method it was checked against.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

_INDEX = re.compile(r"\[(\d+|'[^']*')\]")


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def output_words(path: str) -> str:
    """``out`` -> "the output"; ``out[1]`` -> "the 2nd returned tensor"; deeper paths name
    each level (``out[0][2]`` -> "item 3 of the 1st returned value"); dict keys by name."""
    parts = _INDEX.findall(path)
    if not parts:
        return "the output"
    words = []
    for depth, part in enumerate(reversed(parts)):
        outermost = depth == len(parts) - 1
        if part.startswith("'"):
            words.append(f"entry {part}")
        elif outermost:
            kind = "tensor" if depth == 0 else "value"
            words.append(f"the {ordinal(int(part) + 1)} returned {kind}")
        else:
            words.append(f"item {int(part) + 1}")
    return " of ".join(words)


def call_words(method: Callable, args: tuple[Any, ...], *, name: str = "forward") -> str:
    """``forward(x, residual)``: the call, its arguments named by ``method``'s parameters
    (``self`` skipped); a ``None`` argument is shown as ``name=None``."""
    try:
        params = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        params = []
    shown = []
    for i, arg in enumerate(args):
        label = params[i].name if i < len(params) else f"arg{i}"
        shown.append(f"{label}=None" if arg is None else label)
    return f"the call {name}({', '.join(shown)})"


# Spellings people write for the names case ids use.
_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
    "f16": "float16",
    "fp64": "float64",
}
_TOKEN = re.compile(r"[A-Za-z0-9_.]+")


def near_globs(glob: str, ids: list[str], *, limit: int = 3) -> list[tuple[str, int]]:
    """Globs near ``glob`` that match some of ``ids``, with how many: each word of the glob
    that appears in no id is replaced by a known alias's target (``bf16`` -> ``bfloat16``)
    or by the closest words of the ids (`difflib`)."""
    import difflib

    from opcore_conformance.expectations import compile_glob

    words = {w for i in ids for w in _TOKEN.findall(i)}
    variants = [glob]
    for word in dict.fromkeys(_TOKEN.findall(glob)):
        if word in words:
            continue
        options = (
            [_ALIASES[word.lower()]] if word.lower() in _ALIASES else []
        ) + difflib.get_close_matches(word, words, n=3, cutoff=0.6)
        if options:
            variants = [
                re.sub(rf"(?<![A-Za-z0-9_.]){re.escape(word)}(?![A-Za-z0-9_.])", o, v)
                for v in variants
                for o in dict.fromkeys(options)
            ]
    out = []
    for v in dict.fromkeys(variants):
        if v == glob:
            continue
        pattern = compile_glob(v)
        n = sum(1 for i in ids if pattern.fullmatch(i))
        if n:
            out.append((v, n))
    return sorted(out, key=lambda x: -x[1])[:limit]
