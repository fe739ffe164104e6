"""Shape buckets: the key a tuning table entry is stored and looked up under.

A bucket is ``(tokens bucket, shape)``. The token bucket is the power of two at or above
the token count, as its exponent: ``token_bucket(t) = (t - 1).bit_length()`` (1 -> 0,
2 -> 1, 3..4 -> 2, 4097..8192 -> 13), so a lookup is one integer operation and one index.
``shape`` is everything else that selects a kernel's launch, exact (a hidden size, the
head counts); a shape the table was not tuned on has no entry and the provider's own
heuristic applies.

Each op has a key function from its arguments (metadata only, so it runs on fake
tensors) returning ``(dtype, tokens, shape)``. The six core ops have theirs here;
`register_bucket_key` adds one for another op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_BUCKET = 48  # 2**48 tokens: far past any real batch

Key = tuple[Any, int, tuple]


def token_bucket(tokens: int) -> int:
    """The exponent of the power of two at or above ``tokens`` (0 for 0 or 1 token)."""
    return (tokens - 1).bit_length() if tokens > 1 else 0


def bucket_tokens(bucket: int) -> int:
    """The largest token count of ``bucket``."""
    return 1 << bucket


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


def register_bucket_key(op: str, fn: Callable[..., Key]) -> None:
    """Declare how ``op``'s positional arguments map to ``(dtype, tokens, shape)``."""
    _KEYS[op] = fn
    _FLAT.pop(op, None)  # the router derives its form from ``fn`` (`flat_key_function`)
    _FIRST_ARG_REDECLARED.add(op)


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
