"""Shape buckets: the key a tuning table entry is stored and looked up under.

A bucket is ``(tokens bucket, shape)``. The token bucket is the power of two at or above
the token count, as its exponent: ``token_bucket(t) = (t - 1).bit_length()`` (1 -> 0,
2 -> 1, 3..4 -> 2, 4097..8192 -> 13), so a lookup is one integer operation and one index.
``shape`` is everything else that selects a kernel's launch, exact (a hidden size, the
head counts); a shape the table was not tuned on has no entry of its own: it borrows a
tuned shape's where the provider's heuristic treats the two alike, else the heuristic
applies (`opcore.tuning.lend.lend_row`).

Each op has a key function from its arguments (metadata only, so it runs on fake
tensors) returning ``(dtype, tokens, shape)``. The six core ops have theirs here;
`register_bucket_key` adds one for another op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

MAX_BUCKET = 48  # 2**48 tokens: far past any real batch

Key = tuple[Any, int, tuple]


def token_bucket(tokens: int) -> int:
    """The exponent of the power of two at or above ``tokens`` (0 for 0 or 1 token)."""
    return (tokens - 1).bit_length() if tokens > 1 else 0


def bucket_tokens(bucket: int) -> int:
    """The largest token count of ``bucket``."""
    return 1 << bucket


def fill_buckets(points: Mapping[int, Any]) -> list:
    """A value per bucket 0..MAX_BUCKET: the tuned bucket nearest in log2 (the larger on a
    tie), so an unseen token count uses the closest measured one."""
    tuned = sorted(points)
    out = []
    for b in range(MAX_BUCKET + 1):
        best = min(tuned, key=lambda t: (abs(t - b), -t))
        out.append(points[best])
    return out


# These run on every eager call of an op a table reorders: few tensor attribute reads
# (each costs about 0.1 us), no helper calls. int() turns a traced size into its hint.
def _norm(x, *rest) -> Key:
    s = x.shape
    n = int(s[-1])
    return x.dtype, (int(s[0]) if len(s) == 2 else int(x.numel()) // max(n, 1)), (n,)


def _silu(x) -> Key:
    s = x.shape
    n = int(s[-1])
    return x.dtype, (int(s[0]) if len(s) == 2 else int(x.numel()) // max(n, 1)), (n // 2,)


def _gelu(x, approximate="none") -> Key:
    s = x.shape
    n = int(s[-1])
    t = int(s[0]) if len(s) == 2 else int(x.numel()) // max(n, 1)
    return x.dtype, t, (n // 2, approximate)


def _heads(t: Any, tokens: int, head_size: int) -> int:
    return int(t.numel()) // (tokens * head_size) if tokens and head_size else 0


def _rotary(positions, query, key, head_size, cos_sin_cache, is_neox) -> Key:
    t = int(positions.numel())
    nk = 0 if key is None else _heads(key, t, head_size)
    return query.dtype, t, (_heads(query, t, head_size), nk, int(head_size))


def _split(qkv, qw, kw, eps, positions, cache, num_heads, num_kv_heads, head_size, is_neox) -> Key:
    return qkv.dtype, int(positions.numel()), (int(num_heads), int(num_kv_heads), int(head_size))


_KEYS: dict[str, Callable[..., Key]] = {
    "rms_norm": _norm,
    "fused_add_rms_norm": _norm,
    "silu_and_mul": _silu,
    "gelu_and_mul": _gelu,
    "rotary_embedding": _rotary,
    "split_qkv_rmsnorm_rope": _split,
}


# The router's form of the same keys, on the argument tuple as dispatch holds it: a flat
# ``(dtype, *shape)`` and the token count, reading sizes as they are (no ``int()``, no
# nested tuple, no argument unpacking). The router falls back to the key functions above
# where a size is symbolic (tracing). Measured in bench/results/dispatch_overhead.md.
FlatKey = tuple[tuple, Any]


def _norm_flat(a: tuple) -> FlatKey:
    x = a[0]
    s = x.shape
    n = s[-1]
    return (x.dtype, n), (s[0] if len(s) == 2 else x.numel() // (n or 1))


def _silu_flat(a: tuple) -> FlatKey:
    x = a[0]
    s = x.shape
    n = s[-1]
    return (x.dtype, n // 2), (s[0] if len(s) == 2 else x.numel() // (n or 1))


def _gelu_flat(a: tuple) -> FlatKey:
    x = a[0]
    s = x.shape
    n = s[-1]
    t = s[0] if len(s) == 2 else x.numel() // (n or 1)
    return (x.dtype, n // 2, a[1] if len(a) > 1 else "none"), t


def _rotary_flat(a: tuple) -> FlatKey:
    positions, query, key, head_size = a[0], a[1], a[2], a[3]
    t = positions.numel()
    per = t * head_size
    if not per:
        return (query.dtype, 0, 0, head_size), t
    nk = 0 if key is None else key.numel() // per
    return (query.dtype, query.numel() // per, nk, head_size), t


def _split_flat(a: tuple) -> FlatKey:
    return (a[0].dtype, a[6], a[7], a[8]), a[4].numel()


_FLAT: dict[str, Callable[[tuple], FlatKey]] = {
    "rms_norm": _norm_flat,
    "fused_add_rms_norm": _norm_flat,
    "silu_and_mul": _silu_flat,
    "gelu_and_mul": _gelu_flat,
    "rotary_embedding": _rotary_flat,
    "split_qkv_rmsnorm_rope": _split_flat,
}


# Ops whose key is a function of the first argument's shape and dtype alone: the router
# memoizes its choice per ``(shape, dtype)`` of that argument.
FIRST_ARG_KEYED = frozenset({"rms_norm", "fused_add_rms_norm", "silu_and_mul"})


# What each element of an op's bucket shape is, checked when a table is loaded (so a
# malformed entry is refused there, never met by a lookup or a launch space's check):
# "size" an int >= 1, "count" an int >= 0, a tuple of strings one of those strings.
ShapeSpec = tuple[str | tuple[str, ...], ...]
SHAPE_KINDS = ("size", "count")

_SHAPES: dict[str, ShapeSpec] = {
    "rms_norm": ("size",),  # hidden size
    "fused_add_rms_norm": ("size",),
    "silu_and_mul": ("size",),  # intermediate size
    "gelu_and_mul": ("size", ("none", "tanh")),  # intermediate size, approximation
    "rotary_embedding": ("size", "count", "size"),  # q heads, kv heads (0: no key), head size
    "split_qkv_rmsnorm_rope": ("size", "size", "size"),  # q heads, kv heads, head size
}


def register_bucket_key(op: str, fn: Callable[..., Key], *, shape: ShapeSpec | None = None) -> None:
    """Declare how ``op``'s positional arguments map to ``(dtype, tokens, shape)``.

    ``shape``: what each element of the shape is (``"size"``: an int >= 1, ``"count"``: an
    int >= 0, a tuple of strings: one of them), so a table entry with another shape is
    refused when the table loads; without it an entry's shape is only checked to be a list
    of ints and strings."""
    if shape is not None:
        shape = tuple(shape)
        for kind in shape:
            ok = kind in SHAPE_KINDS or (
                isinstance(kind, tuple) and kind and all(isinstance(k, str) for k in kind)
            )
            if not ok:
                raise ValueError(
                    f"register_bucket_key({op!r}): shape element {kind!r} is not one of "
                    f"{SHAPE_KINDS} or a tuple of strings"
                )
    _KEYS[op] = fn
    _FLAT.pop(op, None)  # the router derives its form from ``fn`` (`flat_key_function`)
    _FIRST_ARG_REDECLARED.add(op)
    if shape is None:
        _SHAPES.pop(op, None)  # a new key: the built-in shape no longer describes it
    else:
        _SHAPES[op] = shape


def shape_spec(op: str) -> ShapeSpec | None:
    """What ``op``'s bucket shape holds, per element, or ``None`` when it was not declared."""
    return _SHAPES.get(op)


def shape_problem(op: str, shape: object) -> str | None:
    """``None`` when ``shape`` (as read from a table: a list) is a valid bucket shape of
    ``op``, else the reason. Every shape is a list of ints and strings; an op with a
    declared `shape_spec` also needs its length, types and values."""
    if not isinstance(shape, list):
        return f"must be a list, got {type(shape).__name__}"
    for i, v in enumerate(shape):
        if isinstance(v, bool) or not isinstance(v, int | str):
            return f"element {i} is {v!r}: each element must be an int or a string"
    spec = _SHAPES.get(op)
    if spec is None:
        return None
    if len(shape) != len(spec):
        return f"{op} takes {len(spec)} element(s) ({_describe(spec)}), got {len(shape)}"
    for i, (v, kind) in enumerate(zip(shape, spec, strict=True)):
        if isinstance(kind, tuple):
            if not isinstance(v, str) or v not in kind:
                return f"element {i} is {v!r}: {op} takes one of {list(kind)} there"
            continue
        low = 1 if kind == "size" else 0
        if not isinstance(v, int) or v < low:
            return f"element {i} is {v!r}: {op} takes an int >= {low} there"
    return None


def _describe(spec: ShapeSpec) -> str:
    return ", ".join(
        f"one of {list(k)}" if isinstance(k, tuple) else ("int >= 1" if k == "size" else "int >= 0")
        for k in spec
    )


_FIRST_ARG_REDECLARED: set[str] = set()


def keyed_by_first_arg(op: str) -> bool:
    """Whether ``op``'s bucket key depends on its first argument's shape and dtype only
    (a built-in key not redeclared by `register_bucket_key`)."""
    return op in FIRST_ARG_KEYED and op not in _FIRST_ARG_REDECLARED


def key_function(op: str) -> Callable[..., Key] | None:
    """The key function of ``op``, or ``None`` when it has none."""
    return _KEYS.get(op)


def flat_key_function(op: str) -> Callable[[tuple], FlatKey] | None:
    """``args -> ((dtype, *shape), tokens)`` for ``op`` (the same key as `key_function`'s,
    flat, over the argument tuple), or ``None`` when the op has no key function."""
    fast = _FLAT.get(op)
    if fast is not None:
        return fast
    keyfn = _KEYS.get(op)
    if keyfn is None:
        return None

    def flat(a: tuple) -> FlatKey:
        dtype, tokens, shape = keyfn(*a)
        return (dtype,) + tuple(shape), tokens

    return flat


def shape_of(value: Any) -> tuple:
    """A shape as stored in JSON (a list) back to the tuple used as a key."""
    return tuple(value)
