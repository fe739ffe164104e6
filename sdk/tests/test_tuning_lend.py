"""A shape no tuning table entry has borrows the nearest tuned shape's configuration where
the provider's own heuristic treats the two alike (`opcore.tuning.lend.lend_row`,
docs/tuning.md "Buckets"): the rule on toy launch spaces, then through a real table loaded
by the index, a registered provider and `launch_config` as the launchers call it."""

from __future__ import annotations

import json

import pytest
import torch

import opcore.ir  # noqa: F401  (hands the tuning index its sources, as any dispatch does)
from opcore.tuning import buckets, lend, runtime, space, table

ROW = buckets.MAX_BUCKET + 1


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _tile_space(**over) -> space.LaunchSpace:
    """A space whose heuristic is one tile of ``next_pow2(width)``, and two rows per
    program from 64 tokens: the few-rows and many-rows regimes of the real norms."""
    kw = dict(
        params=("W", "R"),
        default=lambda t, s: {"W": _pow2(s[0]), "R": 1 if t < 64 else 2},
        candidates=lambda t, s: [],
        check=lambda c, s: None if c["W"] >= s[0] else f"W={c['W']} is narrower than {s[0]}",
    )
    kw.update(over)
    return space.LaunchSpace(**kw)


def _row(cfg: dict) -> dict:
    """A tuned shape's measured buckets: every one, with ``cfg``."""
    return {b: dict(cfg) for b in range(ROW)}


def test_a_shape_borrows_from_the_nearest_tuned_shape_the_heuristic_treats_alike():
    sp = _tile_space()
    tuned = {(64,): _row({"W": 64, "R": 4}), (256,): _row({"W": 256, "R": 8})}
    row, by = lend.lend_row(sp, (48,), tuned)  # next_pow2 64, as the tuned 64
    assert row[0] == {"W": 64, "R": 4} and by[0] == (64,)
    row, by = lend.lend_row(sp, (200,), tuned)  # 256's tile
    assert row[20] == {"W": 256, "R": 8} and by[20] == (256,)
    # 80 columns: the heuristic takes a 128 tile, which neither tuned shape has
    row, by = lend.lend_row(sp, (80,), tuned)
    assert row == [None] * ROW and by == [None] * ROW


def test_a_bucket_where_the_heuristic_changes_its_choice_lends_nothing():
    sp = _tile_space()
    row, _ = lend.lend_row(sp, (48,), {(64,): _row({"W": 64, "R": 4})})
    # bucket 6 is 33..64 tokens: one row below 64 tokens and two at 64, so the model's
    # choice is not one through the bucket; buckets 5 (17..32) and 7 (65..128) are
    assert row[6] is None
    assert row[5] == row[7] == {"W": 64, "R": 4}


def test_only_buckets_the_lender_measured_lend():
    sp = _tile_space(default=lambda t, s: {"W": 0, "R": 1}, check=lambda c, s: None)
    row, by = lend.lend_row(sp, (48,), {(64,): {0: {"W": 1, "R": 1}, 12: {"W": 2, "R": 1}}})
    assert row[0] == {"W": 1, "R": 1} and row[12] == {"W": 2, "R": 1}
    # the lender's other buckets are filled from those two at its own shape only
    assert [b for b in range(ROW) if row[b] is not None] == [0, 12]
    assert by[5] is None


def test_a_config_failing_the_space_check_at_the_borrower_is_not_lent():
    # the heuristic sees both alike, but the tuned tile is narrower than the borrower
    sp = _tile_space(default=lambda t, s: {"W": 0, "R": 1})
    row, _ = lend.lend_row(sp, (100,), {(64,): _row({"W": 64, "R": 1})})
    assert row == [None] * ROW
    row, _ = lend.lend_row(sp, (60,), {(64,): _row({"W": 64, "R": 1})})
    assert row[0] == {"W": 64, "R": 1}


def test_nearest_lender_first_and_the_larger_on_a_tie():
    sp = _tile_space(default=lambda t, s: {"W": 0, "R": 1}, check=lambda c, s: None)
    tuned = {(32,): _row({"W": 1, "R": 1}), (128,): _row({"W": 2, "R": 1}),
             (100,): _row({"W": 3, "R": 1})}  # fmt: skip
    assert lend.lend_row(sp, (90,), tuned)[1][0] == (100,)
    # 64 is one power of two from 32 and from 128: the larger lends
    assert lend.lend_row(sp, (64,), {k: tuned[k] for k in ((32,), (128,))})[1][0] == (128,)


def test_only_shapes_of_the_same_kind_lend():
    sp = _tile_space(default=lambda t, s: {"W": 0, "R": 1}, check=lambda c, s: None)
    # another approximation, another length, a key against none (0 kv heads)
    assert (
        lend.lend_row(sp, (4096, "tanh"), {(4096, "none"): _row({"W": 1, "R": 1})})[1]
        == [None] * ROW
    )
    assert lend.lend_row(sp, (32, 8, 128), {(32, 128): _row({"W": 1, "R": 1})})[1] == ([None] * ROW)
    assert lend.lend_row(sp, (32, 0, 128), {(32, 8, 128): _row({"W": 1, "R": 1})})[1] == (
        [None] * ROW
    )
    assert lend.lend_row(sp, (28, 4, 128), {(32, 8, 128): _row({"W": 1, "R": 1})})[1][0] == (
        32,
        8,
        128,
    )


def test_a_heuristic_that_cannot_read_the_shape_lends_nothing():
    def picky(t, s):
        if s[0] == 48:
            raise ValueError("no")
        return {"W": 0, "R": 1}

    sp = _tile_space(default=picky, check=lambda c, s: None)
    assert lend.lend_row(sp, (48,), {(64,): _row({"W": 1, "R": 1})})[0] == [None] * ROW


# --------------------------------------------------------------------------- the index
TOY = "lend_test_tile"
# The toy provider's heuristic calls (a space is declared once per process: it counts them
# for every test; each test clears it).
HEURISTIC_CALLS: list = []


def _counted_default(t, s):
    HEURISTIC_CALLS.append((t, s))
    return {"W": _pow2(s[0]), "R": 1}


space.register_space(
    "rms_norm", TOY, _tile_space(default=_counted_default, reduction_params=("W", "R"))
)


@pytest.fixture
def toy_provider(monkeypatch, tmp_path):
    """A provider of ``rms_norm`` with a tile space, and a table naming it at hidden 64
    (1 and 4096 tokens) through ``OPCORE_TUNING``."""
    from opcore.ir import ops
    from opcore.testing.ir import temporary_impl

    name = TOY
    calls = HEURISTIC_CALLS
    calls.clear()

    def impl(x, weight, epsilon, variance_size=None):
        return ops.rms_norm.native(x, weight, epsilon, variance_size)

    with temporary_impl(ops.rms_norm, name, impl):
        doc = {
            "format": table.FORMAT,
            "version": table.VERSION,
            "environment": runtime.environment(),
            "providers": {"rms_norm": {name: ops.rms_norm.identity_hash(name)}},
            "entries": [
                {"op": "rms_norm", "dtype": "bfloat16", "tokens": t, "shape": [64],
                 "order": [], "configs": {name: {"W": 64, "R": r}}}
                for t, r in ((1, 4), (4096, 8))
            ],
        }  # fmt: skip
        path = tmp_path / "table.json"
        path.write_text(json.dumps(doc))
        monkeypatch.setenv(runtime.ENV, str(path))
        runtime.reload()
        try:
            yield name, calls
        finally:
            monkeypatch.setenv(runtime.ENV, "off")
            runtime.reload()


def test_launch_config_lends_at_an_untuned_width_and_explain_names_the_lender(toy_provider):
    name, _ = toy_provider
    bf16 = torch.bfloat16
    assert runtime.launch_config("rms_norm", name, bf16, 1, (64,)) == {"W": 64, "R": 4}
    # 48 columns run in the heuristic's 64-column tile too: the table's choice at 64 holds
    assert runtime.launch_config("rms_norm", name, bf16, 1, (48,)) == {"W": 64, "R": 4}
    assert runtime.launch_config("rms_norm", name, bf16, 3000, (48,)) == {"W": 64, "R": 8}
    # 32 tokens: the tuned shape fills it from its 1-token entry; a borrower does not
    assert runtime.launch_config("rms_norm", name, bf16, 32, (64,)) == {"W": 64, "R": 4}
    assert runtime.launch_config("rms_norm", name, bf16, 32, (48,)) is None
    # 100 columns take a 128 tile: no tuned shape is alike, the heuristic applies
    assert runtime.launch_config("rms_norm", name, bf16, 1, (100,)) is None
    # another dtype has no tuned shape at all
    assert runtime.launch_config("rms_norm", name, torch.float16, 1, (48,)) is None

    x, w = torch.empty(1, 48, dtype=bf16), torch.empty(48, dtype=bf16)
    note = runtime.explain_note("rms_norm", name, (x, w, 1e-6))
    assert note is not None and "lent by the tuned shape (64,)" in note and "(48,)" in note
    assert (
        runtime.explain_note("rms_norm", name, (torch.empty(1, 100, dtype=bf16), w, 1e-6)) is None
    )


def test_a_lent_row_is_worked_out_once_per_shape(toy_provider):
    name, calls = toy_provider
    runtime.launch_config("rms_norm", name, torch.bfloat16, 1, (48,))
    runtime.launch_config("rms_norm", name, torch.bfloat16, 1, (100,))
    before = len(calls)
    assert before > 0
    for t in (1, 7, 4096, 10**6):
        runtime.launch_config("rms_norm", name, torch.bfloat16, t, (48,))
        runtime.launch_config("rms_norm", name, torch.bfloat16, t, (100,))
    assert len(calls) == before  # both rows (one of them all None) are in the index now


def test_lent_rows_are_bounded_and_redone_after_a_reload(toy_provider, monkeypatch):
    name, _ = toy_provider
    monkeypatch.setattr(runtime, "MAX_LENT", 4)
    for width in range(33, 45):
        assert runtime.launch_config("rms_norm", name, torch.bfloat16, 1, (width,)) == {
            "W": 64,
            "R": 4,
        }
    assert len(runtime._LENT) <= 4
    runtime.reload()
    assert runtime._LENT == {}
    assert runtime.launch_config("rms_norm", name, torch.bfloat16, 1, (48,)) == {"W": 64, "R": 4}


def test_nothing_is_lent_for_a_reduction_when_batch_invariance_is_required(toy_provider):
    name, _ = toy_provider
    # The table says it was not tuned for batch invariance, so its reduction configs are
    # out already; and lenders may differ between buckets, so nothing is lent either.
    runtime.reload(required_properties=("batch_invariant",))
    assert runtime.launch_config("rms_norm", name, torch.bfloat16, 1, (48,)) is None
    runtime.reload(required_properties=())
    assert runtime.launch_config("rms_norm", name, torch.bfloat16, 1, (48,)) == {"W": 64, "R": 4}


class _TracedCount:
    """A token count whose value may not be read, as a traced size whose reading would
    specialise the compiled graph to it (the CI of 2026-12-05 caught this: an untuned
    shape's lookup read the count, and a dynamic batch under `torch.compile` became 3)."""

    def __int__(self):
        raise AssertionError("the token count was read")

    __index__ = __int__


def test_a_shape_nothing_lends_to_answers_none_without_reading_the_token_count(toy_provider):
    name, _ = toy_provider
    bf16 = torch.bfloat16
    assert runtime.launch_config("rms_norm", name, bf16, _TracedCount(), (100,)) is None
    assert runtime.launch_config("rms_norm", name, torch.float16, _TracedCount(), (48,)) is None
    with pytest.raises(AssertionError, match="was read"):  # a lent row does need the bucket
        runtime.launch_config("rms_norm", name, bf16, _TracedCount(), (48,))
