"""Lending: the launch configuration a shape no tuning table has borrows from a tuned one.

The rule (`lend_row`): where a provider's own heuristic (its launch space's ``default``,
the launch model) treats two shapes alike, the table's correction of the model at one
holds at the other. Where the model tells them apart, the model is the better guess. Pure
functions of a launch space and the tuned rows: `opcore.tuning.runtime` calls them once
per shape and keeps the answer in its index.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from opcore.tuning.buckets import MAX_BUCKET
from opcore.tuning.space import LaunchSpace


def bucket_ends(bucket: int) -> tuple[int, int]:
    """The smallest and largest token counts of ``bucket`` (1 for bucket 0)."""
    return (1, 1) if bucket == 0 else ((1 << (bucket - 1)) + 1, 1 << bucket)


def lender_distance(lender: tuple, shape: tuple) -> float | None:
    """How far tuned shape ``lender`` is from ``shape`` (the sum of the sizes' log2
    differences), or ``None`` when it may not lend to it: another length, another
    non-size part (GELU's approximation), or a size that is 0 in one and not the other
    (rotary without a key)."""
    if len(lender) != len(shape):
        return None
    far = 0.0
    for a, b in zip(lender, shape, strict=True):
        if (
            isinstance(a, bool)
            or isinstance(b, bool)
            or not (isinstance(a, int) and isinstance(b, int))
        ):
            if a != b:
                return None
            continue
        if (a <= 0) != (b <= 0):
            return None
        if a > 0:
            far += abs(math.log2(a) - math.log2(b))
    return far


def lend_row(
    space: LaunchSpace, shape: tuple, tuned: Mapping[tuple, Mapping[int, Any]]
) -> tuple[list, list]:
    """For ``shape``, which no table entry has: per token bucket, the configuration of the
    nearest shape tuned at that bucket (``tuned``: shape -> {bucket: config}, the buckets
    its entries measured; nearest by `lender_distance`, the larger on a tie) at which the
    space's own heuristic (``space.default``, the launch model) makes one choice through
    the bucket, the same as at ``shape``, and which passes the space's check at ``shape``;
    ``None`` for a bucket no tuned shape lends to (the heuristic applies there).

    The rule: where the model treats two shapes alike, the table's correction of the model
    at one holds at the other (a norm's row of 3584 columns runs in the 4096-column tile
    the model and the table chose for 4096). Where the model tells them apart (another
    tile, another regime, another count of rows per program), the model is the better
    guess. Only measured buckets lend: a lender's configuration filled in from another
    token count is two guesses stacked (on the H200 sweep of 2026-12-02 such rows ran up
    to 1.49x the model's time; `bench/sweep_report.py lend`). Returns ``(row, lenders)``: the
    configurations and the shape each came from."""
    lenders = [s for s in tuned if lender_distance(s, shape) is not None]
    lenders.sort(key=lambda s: (lender_distance(s, shape), -shape_size(s), repr(s)))

    def model(tokens: int, s: tuple) -> Any:
        try:
            return dict(space.default(tokens, s))
        except Exception:  # a heuristic that cannot read a shape: it lends nothing
            return None

    row: list = []
    lent_by: list = []
    for b in range(MAX_BUCKET + 1):
        lo, hi = bucket_ends(b)
        here = model(lo, shape)
        pick = None
        if here is not None and model(hi, shape) == here:
            for s in lenders:
                cfg = tuned[s].get(b)
                if (
                    cfg is not None
                    and model(lo, s) == here
                    and model(hi, s) == here
                    and space.validate(cfg, shape) is None
                ):
                    pick = s
                    break
        row.append(None if pick is None else tuned[pick][b])
        lent_by.append(pick)
    return row, lent_by


def shape_size(shape: tuple) -> int:
    """The product of a shape's sizes (the tie-break toward the larger lender)."""
    n = 1
    for v in shape:
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            n *= v
    return n
