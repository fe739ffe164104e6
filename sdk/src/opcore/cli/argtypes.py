"""Argument types shared by the ``opcore`` commands (and by other distributions' commands).

Each is an ``argparse`` ``type=`` callable: it returns the parsed value or raises
`argparse.ArgumentTypeError`, which argparse reports as one ``error: argument --FLAG: ...``
line after the usage and exit status 2, so the message names the flag. Torch-free.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_finite_float", "positive_int"]


def positive_finite_float(text: str) -> float:
    """``text`` as a float that is finite and > 0; ``0``, negatives, ``nan`` and ``inf``
    are refused."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """``text`` as an int >= 1 (decimal digits only: ``1.5`` and ``0`` are refused)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
