"""``opcore conformance``: provided by the separate ``opcore-conformance`` distribution.

The core does not depend on the suite: this module imports `opcore_conformance.cli` only
when the parser is built, and when it is not installed the subcommand still appears and
explains what to install.
"""

from __future__ import annotations

import argparse
import sys

INSTALL_HINT = (
    "opcore conformance needs the opcore-conformance distribution: "
    "pip install opcore-conformance (or, in a checkout, pip install -e conformance)"
)


def _missing(args: argparse.Namespace) -> int:
    print(f"opcore: {INSTALL_HINT}", file=sys.stderr)
    return 2


def add_parser(subparsers) -> argparse.ArgumentParser:
    try:
        from opcore_conformance import cli
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("opcore_conformance"):
            raise
        # prefix_chars="+": every argument, "--ops" and "--help" included, lands in `rest`,
        # so any invocation reaches the install hint instead of an argparse error.
        parser = subparsers.add_parser(
            "conformance", help="check this platform (needs opcore-conformance)",
            description=INSTALL_HINT, prefix_chars="+", add_help=False,
        )
        parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
        parser.set_defaults(run=_missing)
        return parser
    return cli.add_parser(subparsers)


def run(args: argparse.Namespace) -> int:
    return int(args.run(args))
