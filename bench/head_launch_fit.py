"""The head kernels' candidate launch rule (issue 31), fitted to a recorded head sweep and
waiting for a device to search the shipped tuning tables again in the same call.

`opcore.kernels.triton._launch` sizes rotary's and the fused QKV split's grids by a fixed
1024 programs (``4 * MIN_PROGRAMS``) and one warp per 256 elements. The H100 sweep of
2026-12-06 (`bench/results/2026-12-06-h100-launch/head-sweep-fit.jsonl`) found that rule
1.04-1.23x behind each shape's best configuration. The rule here:

- **Fewer tokens than multiprocessors:** split a token's heads in powers of two until the
  tokens x splits reach the multiprocessor count (down to one head of the smaller group
  per program). Rotary: about 128 elements of the program's padded tile per warp; the
  fused split: one warp (each head's RMS reduction stays in a warp).
- **Else** one program per token. Rotary: about 1024 elements of the token's real heads
  per warp. The fused split: the same up to 4 tokens per multiprocessor, then about 2048
  padded elements per warp, at least 2 (today's rule there).

Why it is not in `_launch` yet: an edit to `_launch` or `spaces` changes every triton
provider's identity, so every shipped table goes stale (`opcore info` reports it, the
plugin's test refuses to ship it). The session that fitted it had no device time left to
search the tables again. Adopting it: move `token_head_params` / `split_qkv_params` below
into `_launch` (the launchers pass their device's multiprocessor count), run
`bench/gpu/tune_search.sh` on each device whose table ships, and check shapes left out of
this fit with `bench/gpu/head_sweep.sh` (say ``HEAD_SWEEP_ARGS="--tokens 1,64,512,2048,8192
--heads 2048,2304,8192"``).

    python bench/head_launch_fit.py --sweep SWEEP.jsonl [--sms 132] [--out REPORT.md]

prints the regret (`bench/sweep_report.py regret`) of today's rule and of this one on the
sweep's shapes. Runs on the CPU (``TRITON_INTERPRET=1`` for the launch spaces).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from opcore.kernels.triton import _launch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_report  # noqa: E402  (a sibling script)

LATENCY_TOKENS_PER_SM = _launch.LATENCY_ROWS_PER_SM


@functools.cache
def token_head_params(
    n_tokens: int, n_a: int, n_b: int, head_cols: int, sms: int
) -> tuple[int, int, int, int]:
    """``(PROGRAMS, BLOCK_A, BLOCK_B, num_warps)`` as `_launch.token_head_params`, by the
    candidate rule (the module docstring)."""
    smaller = min(n_a, n_b) if n_b else n_a
    splits = 1
    while n_tokens * splits < sms and 2 * splits <= smaller:
        splits *= 2
    programs, block_a, block_b = _launch.head_split(n_a, n_b, splits)
    if n_tokens < sms:
        warps = _launch.warps_for((block_a + block_b) * head_cols, per_warp=128, cap=8)
    else:
        warps = _launch.warps_for((n_a + n_b) * head_cols, per_warp=1024, cap=8)
    return programs, block_a, block_b, warps


@functools.cache
def split_qkv_params(
    n_tokens: int, n_q: int, n_kv: int, head_cols: int, sms: int
) -> tuple[int, int, int, int]:
    """``(PROGRAMS, BLOCK_Q, BLOCK_KV, num_warps)`` as `_launch.split_qkv_params`, by the
    candidate rule."""
    programs, block_q, block_kv, warps = token_head_params(n_tokens, n_q, n_kv, head_cols, sms)
    if n_tokens < sms:
        warps = 1
    elif n_tokens > LATENCY_TOKENS_PER_SM * sms:
        warps = max(2, _launch.warps_for((block_q + block_kv) * head_cols, per_warp=2048, cap=8))
    return programs, block_q, block_kv, warps


def space_default(params, sms: int):
    """A launch-space default (``f(tokens, shape) -> {SPLITS, num_warps}``) from ``params``,
    as `opcore.kernels.triton.spaces` derives its head defaults."""

    def default(tokens: int, shape: tuple) -> dict[str, int]:
        n_a, n_b, head = shape
        head_cols = 2 * _launch.next_pow2(head // 2)
        _, block_a, _, warps = params(max(tokens, 1), n_a, n_b, head_cols, sms)
        splits = _launch.next_pow2(_launch.cdiv(n_a, block_a))
        return {"SPLITS": min(splits, _launch.max_head_splits(n_a, n_b)), "num_warps": warps}

    return default


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", required=True, help="a head sweep's sweep.jsonl")
    ap.add_argument("--sms", type=int, default=_launch.REFERENCE_SMS,
                    help="the swept device's multiprocessor count")  # fmt: skip
    ap.add_argument("--out", help="also write the two reports here (markdown)")
    opts = ap.parse_args()
    lines = Path(opts.sweep).read_text().splitlines()
    head, sweep = json.loads(lines[0]), [json.loads(x) for x in lines[1:] if x.strip()]
    sweep = [r for r in sweep if r["op"] in ("rotary_embedding", "split_qkv_rmsnorm_rope")]
    candidate = {
        "rotary_embedding": space_default(token_head_params, opts.sms),
        "split_qkv_rmsnorm_rope": space_default(split_qkv_params, opts.sms),
    }
    today = sweep_report.regret(sweep)
    fitted = sweep_report.regret(sweep, defaults=candidate)
    print("op, tokens: geomean regret (worst), today's rule -> the candidate")
    for name, s in today["summary"].items():
        c = fitted["summary"][name]
        print(f"  {name}: {s['geomean']} ({s['max']}) -> {c['geomean']} ({c['max']})")
    if opts.out:
        text = "# Today's head rule\n\n" + sweep_report.regret_report(today, head, 12)
        text += "\n# The candidate rule\n\n" + sweep_report.regret_report(fitted, head, 12)
        Path(opts.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
