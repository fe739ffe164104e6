"""The head kernels' launch rule (issue 31) against the rule it replaced, on a recorded
head sweep.

`opcore.kernels.triton._launch.token_head_params` / `split_qkv_params` hold the rule fitted
to the H100 sweep of 2026-12-06 (`bench/results/2026-12-06-h100-launch/
head-sweep-fit.jsonl`): split a token's heads only until tokens x splits reach the
multiprocessor count; rotary on about 128 elements a warp when split and 1024 per token
otherwise; the fused split on one warp when split. The rule before it sized the grid by a
fixed 1024 programs (``4 * MIN_PROGRAMS``) and one warp per 256 elements; it is kept here
(`earlier_token_head_params`, `earlier_split_qkv_params`) to score the two on any sweep,
a held-out one included (`bench/gpu/head_sweep.sh`, say ``HEAD_SWEEP_ARGS="--tokens
1,64,512,2048,8192 --heads 2048,2304,8192"``).

    python bench/head_launch_fit.py --sweep SWEEP.jsonl [--sms 132] [--out REPORT.md]

prints the regret (`bench/sweep_report.py regret`) of the earlier rule and of `_launch`'s on
the sweep's shapes. Runs on the CPU (``TRITON_INTERPRET=1`` for the launch spaces).
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


@functools.cache
def earlier_token_head_params(
    n_tokens: int, n_a: int, n_b: int, head_cols: int, sms: int
) -> tuple[int, int, int, int]:
    """The rule `_launch.token_head_params` replaced: heads split until about ``4 *
    MIN_PROGRAMS`` programs whatever the device (today's split with that many
    "multiprocessors"; ``sms`` unused), one warp per 256 padded elements."""
    programs, block_a, block_b, _ = _launch.token_head_params(
        n_tokens, n_a, n_b, head_cols, 4 * _launch.MIN_PROGRAMS
    )
    return programs, block_a, block_b, _launch.warps_for((block_a + block_b) * head_cols, 256, 8)


@functools.cache
def earlier_split_qkv_params(
    n_tokens: int, n_q: int, n_kv: int, head_cols: int, sms: int
) -> tuple[int, int, int, int]:
    """The fused split's earlier rule: `earlier_token_head_params`, and about 2048
    elements per warp (at least 2) from 1024 tokens."""
    programs, block_q, block_kv, warps = earlier_token_head_params(
        n_tokens, n_q, n_kv, head_cols, sms
    )
    if programs == 1 and n_tokens >= 4 * _launch.MIN_PROGRAMS:
        warps = max(2, _launch.warps_for((block_q + block_kv) * head_cols, 2048, 8))
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
    rules = {}
    for label, thp, sqp in (
        ("earlier", earlier_token_head_params, earlier_split_qkv_params),
        ("adopted", _launch.token_head_params, _launch.split_qkv_params),
    ):
        defaults = {
            "rotary_embedding": space_default(thp, opts.sms),
            "split_qkv_rmsnorm_rope": space_default(sqp, opts.sms),
        }
        rules[label] = sweep_report.regret(sweep, defaults=defaults)
    print("op, tokens: geomean regret (worst), the earlier rule -> the adopted one")
    for name, s in rules["earlier"]["summary"].items():
        c = rules["adopted"]["summary"][name]
        print(f"  {name}: {s['geomean']} ({s['max']}) -> {c['geomean']} ({c['max']})")
    if opts.out:
        text = "# The earlier head rule\n\n"
        text += sweep_report.regret_report(rules["earlier"], head, 12)
        text += "\n# The adopted rule (`_launch`)\n\n"
        text += sweep_report.regret_report(rules["adopted"], head, 12)
        Path(opts.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
