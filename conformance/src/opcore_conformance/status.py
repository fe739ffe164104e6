"""The fixed status vocabulary of a conformance case.

``pass``            the check ran and held.
``fail``            the check ran and did not hold (a real defect, or a needed expectation).
``xfail``           it failed, and the expectations file says it is expected to (with a reason).
``xpass``           it passed although the expectations file says it fails: the entry is stale.
``skip``            not run, by choice (an expectations ``skip`` entry, a filter).
``unsupported``     the platform or provider does not claim this (dtype not claimed, provider not
                    supported here, ``supports_args`` declines the sample), or an expectations
                    ``unsupported`` entry says so.
``not_applicable``  the check cannot run on this device or installation (e.g. an opcheck utility
                    the device does not implement, no attention package installed).
``error``           the harness could not run the check (a broken sample generator, an
                    expectations entry that matches no case, an exception outside the kernel).

Only ``fail``, ``error`` and ``xpass`` make a run red.
"""

from __future__ import annotations

PASS = "pass"
FAIL = "fail"
XFAIL = "xfail"
XPASS = "xpass"
SKIP = "skip"
UNSUPPORTED = "unsupported"
NOT_APPLICABLE = "not_applicable"
ERROR = "error"

ALL = (PASS, FAIL, XFAIL, XPASS, SKIP, UNSUPPORTED, NOT_APPLICABLE, ERROR)
RED = frozenset({FAIL, ERROR, XPASS})

# One character per status, for compact matrices (Markdown, progress line).
SYMBOL = {
    PASS: "✓",
    FAIL: "✗",
    XFAIL: "x",
    XPASS: "!",
    SKIP: "s",
    UNSUPPORTED: "–",
    NOT_APPLICABLE: "n/a",
    ERROR: "E",
}


def is_red(status: str) -> bool:
    """True when ``status`` makes the run fail."""
    return status in RED
