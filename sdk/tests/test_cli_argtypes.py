"""`opcore.cli.argtypes`: the shared argparse types refuse every value outside their range,
and argparse names the flag in its one error line."""

from __future__ import annotations

import argparse

import pytest

from opcore.cli.argtypes import positive_finite_float, positive_int


@pytest.mark.parametrize("text", ["0", "-0.0", "-1", "nan", "NaN", "inf", "-inf", "1e999", "x", ""])
def test_positive_finite_float_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a positive finite number"):
        positive_finite_float(text)


def test_positive_finite_float_accepts():
    assert positive_finite_float("2.5") == 2.5 and positive_finite_float("1e-3") == 1e-3


@pytest.mark.parametrize("text", ["0", "-5", "1.5", "x", "", "nan"])
def test_positive_int_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a positive integer"):
        positive_int(text)


def test_positive_int_accepts():
    assert positive_int("60") == 60


def test_argparse_names_the_flag(capsys):
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--budget-s", type=positive_finite_float)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--budget-s", "nan"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "p: error: argument --budget-s: expected a positive finite number, got 'nan'"
    )
