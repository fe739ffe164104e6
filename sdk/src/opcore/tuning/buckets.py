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


def register_bucket_key(op: str, fn: Callable[..., Key]) -> None:
    """Declare how ``op``'s positional arguments map to ``(dtype, tokens, shape)``."""
    _KEYS[op] = fn


def key_function(op: str) -> Callable[..., Key] | None:
    """The key function of ``op``, or ``None`` when it has none."""
    return _KEYS.get(op)


def shape_of(value: Any) -> tuple:
    """A shape as stored in JSON (a list) back to the tuple used as a key."""
    return tuple(value)
