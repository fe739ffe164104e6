"""The `opcore` command line: `info`, `conformance`, `bench`, `new-plugin`.

Each subcommand is a module here exposing ``add_parser(subparsers)`` and ``run(args) -> int``.
Subcommand modules import their optional dependencies (the conformance suite, cookiecutter)
only when run, and then say what to install if one is missing.

A configuration problem a subcommand leaves to this module (a malformed ``OPCORE_*`` value
or option, a platform that cannot be resolved, a plugin failure under strict mode) is one
line on stderr and exit status 2, never a traceback. `opcore info` handles its own and
documents its exit statuses (docs/cli-info.md).
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ("info", "conformance", "bench", "new-plugin")


def _module_name(command: str) -> str:
    return "opcore.cli." + command.replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opcore", description="opcore: operator semantics once, kernels per platform"
    )
    from opcore import __version__

    parser.add_argument("--version", action="version", version=f"opcore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in SUBCOMMANDS:
        importlib.import_module(_module_name(command)).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from opcore.config import ConfigError
    from opcore.platforms import PlatformResolutionError
    from opcore.plugins import PluginError

    try:
        return int(args.run(args) or 0)
    except (ConfigError, PlatformResolutionError, PluginError) as exc:
        # User-facing configuration problems: one line, no traceback.
        print(f"opcore {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
