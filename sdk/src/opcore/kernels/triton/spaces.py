"""The ``triton`` provider's launch spaces: what `opcore tune` may choose per shape.

Each op's launcher reads `opcore.tuning.launch_config` once per call and uses the
heuristic in `_launch` when the table has nothing for the size. Candidates stay near the
heuristic (a few tile sizes, warps from a quarter to twice its choice) so a search costs
seconds per bucket, not minutes.

- norms (``rms_norm``, ``fused_add_rms_norm``), shape ``(n_cols,)``: ``BLOCK_N`` (the
  row when it is at least ``n_cols``, else a chunk of the two-pass path), ``ROWS`` per
  program, ``num_warps``. All three change the order of the sum of squares.
- gated activations, shape ``(d,)`` (``gelu_and_mul``: ``(d, approximate)``):
  ``BLOCK_C``, ``ROWS``, ``num_warps``, ``COLS_FIRST`` (0: 2-D grid; 1: 1-D grid walking
  columns first, tried from `COLS_FIRST_MIN_TOKENS` tokens, where the grid has many row
  blocks); no reduction.
- ``rotary_embedding`` and ``split_qkv_rmsnorm_rope``, shape ``(q heads, kv heads,
  head_size)``: ``SPLITS`` (programs per token sharing its heads) and ``num_warps``; the
  fused split's per-head norm sums over one head, ordered by ``num_warps``.
"""

from __future__ import annotations

from collections.abc import Mapping

from opcore.kernels.triton import _launch
from opcore.tuning import LaunchSpace, register_space

Config = Mapping[str, int]


def _pow2(v: int) -> bool:
    return v >= 1 and v & (v - 1) == 0


def _check_pow2(config: Config, names: tuple[str, ...], limits: Mapping[str, int]) -> str | None:
    for name in names:
        v = config[name]
        if not _pow2(v) or v > limits.get(name, 1 << 20):
            return f"{name}={v} is not a power of two <= {limits.get(name, 1 << 20)}"
    return None


def _warps_near(base: int, elements: int) -> list[int]:
    """Warps from a quarter to twice ``base`` that give each thread 1 to 64 elements."""
    out = []
    for w in (base // 4, base // 2, base, base * 2):
        if 1 <= w <= 32 and 32 * w <= max(elements, 32) and elements <= 64 * 32 * w:
            out.append(w)
    return sorted(set(out), key=lambda w: (w != base, w))


def _dedupe(configs: list[dict[str, int]]) -> list[dict[str, int]]:
    seen, out = set(), []
    for c in configs:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


# --------------------------------------------------------------------------- norms
NORM_PARAMS = ("BLOCK_N", "ROWS", "num_warps")


def norm_default(tokens: int, shape: tuple) -> Config:
    sms = _launch.multiprocessors()
    block_n, rows, _single, warps = _launch.row_params(max(tokens, 1), shape[0], sms)
    return {"BLOCK_N": block_n, "ROWS": rows, "num_warps": warps}


def norm_candidates(tokens: int, shape: tuple) -> list[dict[str, int]]:
    n = shape[0]
    out: list[dict[str, int]] = []
    if n <= _launch.MAX_FUSED_COLS:
        block_n = _launch.next_pow2(n)
        rows = 1
        while rows <= min(16, _launch.next_pow2(max(tokens, 1))) and block_n * rows <= 8192:
            base = _launch.warps_for(block_n * rows)
            for w in _warps_near(base, block_n * rows):
                out.append({"BLOCK_N": block_n, "ROWS": rows, "num_warps": w})
            rows *= 2
    # The two-pass path with smaller chunks: fewer registers per thread on long rows.
    for chunk in (2048, 4096, 8192):
        if chunk < n:
            base = _launch.warps_for(chunk)
            for w in _warps_near(base, chunk):
                out.append({"BLOCK_N": chunk, "ROWS": 1, "num_warps": w})
    return _dedupe(out)


def norm_check(config: Config, shape: tuple) -> str | None:
    why = _check_pow2(config, NORM_PARAMS, {"BLOCK_N": 65536, "ROWS": 64, "num_warps": 32})
    if why is None and config["BLOCK_N"] < shape[0] and config["ROWS"] != 1:
        why = "the two-pass path (BLOCK_N < n_cols) takes ROWS=1"
    return why


NORM_SPACE = LaunchSpace(
    params=NORM_PARAMS,
    default=norm_default,
    candidates=norm_candidates,
    check=norm_check,
    reduction_params=NORM_PARAMS,
)


# --------------------------------------------------------------------------- activations
ACT_PARAMS = ("BLOCK_C", "ROWS", "num_warps", "COLS_FIRST")
# Below this many tokens a tile grid has few row blocks and both orders are the same.
COLS_FIRST_MIN_TOKENS = 1024


def act_default(tokens: int, shape: tuple) -> Config:
    sms = _launch.multiprocessors()
    block_c, rows, warps, order = _launch.gated_params(max(tokens, 1), shape[0], sms)
    return {"BLOCK_C": block_c, "ROWS": rows, "num_warps": warps, "COLS_FIRST": order}


def act_candidates(tokens: int, shape: tuple) -> list[dict[str, int]]:
    d = shape[0]
    out: list[dict[str, int]] = []
    for tile in (1024, 2048, 4096, 8192):
        block_c = _launch.even_tile(d, tile)
        rows = max(1, min(tile // block_c, _launch.next_pow2(max(tokens, 1))))
        elements = block_c * rows
        base = _launch.warps_for(elements, per_warp=256, cap=8)
        for w in _warps_near(base, elements):
            for order in (0, 1) if tokens >= COLS_FIRST_MIN_TOKENS else (0,):
                out.append({"BLOCK_C": block_c, "ROWS": rows, "num_warps": w, "COLS_FIRST": order})
    return _dedupe(out)


def act_check(config: Config, shape: tuple) -> str | None:
    if config["COLS_FIRST"] not in (0, 1):
        return f"COLS_FIRST={config['COLS_FIRST']} is not 0 or 1"
    tiles = {k: v for k, v in config.items() if k != "COLS_FIRST"}
    return _check_pow2(tiles, ACT_PARAMS[:3], {"BLOCK_C": 65536, "ROWS": 1024, "num_warps": 32})


ACT_SPACE = LaunchSpace(
    params=ACT_PARAMS, default=act_default, candidates=act_candidates, check=act_check
)


# --------------------------------------------------------------------------- heads
HEAD_PARAMS = ("SPLITS", "num_warps")


def _head_cols(shape: tuple) -> int:
    return 2 * _launch.next_pow2(shape[2] // 2)


def head_default(tokens: int, shape: tuple) -> Config:
    n_a, n_b, _ = shape
    programs, block_a, _, warps = _launch.token_head_params(
        max(tokens, 1), n_a, n_b, _head_cols(shape), _launch.multiprocessors()
    )
    splits = _launch.next_pow2(_launch.cdiv(n_a, block_a))
    return {"SPLITS": min(splits, _launch.max_head_splits(n_a, n_b)), "num_warps": warps}


def split_default(tokens: int, shape: tuple) -> Config:
    n_a, n_b, _ = shape
    programs, block_a, _, warps = _launch.split_qkv_params(
        max(tokens, 1), n_a, n_b, _head_cols(shape), _launch.multiprocessors()
    )
    splits = _launch.next_pow2(_launch.cdiv(n_a, block_a))
    return {"SPLITS": min(splits, _launch.max_head_splits(n_a, n_b)), "num_warps": warps}


def _head_candidates(default: Config, shape: tuple) -> list[dict[str, int]]:
    n_a, n_b, _ = shape
    most = _launch.max_head_splits(n_a, n_b)
    out = []
    for s in (default["SPLITS"], default["SPLITS"] // 2, default["SPLITS"] * 2):
        if not 1 <= s <= most:
            continue
        for w in (1, 2, 4, 8):
            out.append({"SPLITS": s, "num_warps": w})
    return _dedupe(out)


def head_candidates(tokens: int, shape: tuple) -> list[dict[str, int]]:
    return _head_candidates(head_default(tokens, shape), shape)


def split_candidates(tokens: int, shape: tuple) -> list[dict[str, int]]:
    return _head_candidates(split_default(tokens, shape), shape)


def head_check(config: Config, shape: tuple) -> str | None:
    why = _check_pow2(config, HEAD_PARAMS, {"SPLITS": 1024, "num_warps": 32})
    most = _launch.max_head_splits(shape[0], shape[1])
    if why is None and config["SPLITS"] > most:
        why = f"SPLITS={config['SPLITS']} exceeds the smaller head group ({most})"
    return why


ROTARY_SPACE = LaunchSpace(
    params=HEAD_PARAMS, default=head_default, candidates=head_candidates, check=head_check
)
SPLIT_SPACE = LaunchSpace(
    params=HEAD_PARAMS,
    default=split_default,
    candidates=split_candidates,
    check=head_check,
    reduction_params=("num_warps",),
)

SPACES = {
    "rms_norm": NORM_SPACE,
    "fused_add_rms_norm": NORM_SPACE,
    "silu_and_mul": ACT_SPACE,
    "gelu_and_mul": ACT_SPACE,
    "rotary_embedding": ROTARY_SPACE,
    "split_qkv_rmsnorm_rope": SPLIT_SPACE,
}


def register_spaces(provider: str) -> None:
    """Declare the spaces above for ``provider`` (idempotent)."""
    for op, space in SPACES.items():
        register_space(op, provider, space)
