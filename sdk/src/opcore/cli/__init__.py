"""The `opcore` command line: every subcommand comes from an installed distribution.

Subcommands are entry points of the ``opcore.cli_commands`` group (`commands`): the core
registers ``info``, ``new-plugin`` and ``bench``; ``opcore-conformance`` registers
``conformance``; any distribution may add its own. ``opcore --help`` lists what is installed.
A command that cannot be loaded is one line on stderr naming its distribution and the other
commands still run (fatal under ``OPCORE_STRICT_PLUGINS=1``, like any plugin failure).

Building the parser imports each command's module, so those modules import nothing heavy
(torch included) at import time: ``opcore --help`` and ``opcore new-plugin`` never load torch.

A configuration problem a subcommand leaves to this module (a malformed ``OPCORE_*`` value
or option, a platform that cannot be resolved, a plugin failure under strict mode) is one
line on stderr and exit status 2, never a traceback. `opcore info` handles its own and
documents its exit statuses (docs/cli-info.md).
"""

from __future__ import annotations

import argparse
import sys

from opcore.cli import commands


def build_parser() -> tuple[argparse.ArgumentParser, list[commands.CommandFailure]]:
    """The ``opcore`` parser with every installed command, and the commands that failed.

    Raises:
        opcore.plugins.PluginError: a command failed under ``OPCORE_STRICT_PLUGINS=1``.
    """
    from opcore import __version__

    parser = argparse.ArgumentParser(
        prog="opcore",
        description="opcore: operator semantics once, kernels per platform",
        epilog=f"Commands come from the installed distributions (entry-point group "
        f"{commands.GROUP}); docs/new-plugin.md says how to add one.",
    )
    parser.add_argument("--version", action="version", version=f"opcore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    failures = commands.add_commands(sub)
    return parser, failures


def _user_error_types() -> tuple[type[BaseException], ...]:
    """The configuration errors reported as one line. Only modules already imported are
    asked: an error class whose module was never imported cannot have been raised, and
    importing it here would load torch for a command that needs none."""
    from opcore.config import ConfigError

    types: list[type[BaseException]] = [ConfigError]
    for module, name in (
        ("opcore.platforms", "PlatformResolutionError"),
        ("opcore.plugins", "PluginError"),
    ):
        loaded = sys.modules.get(module)
        if loaded is not None:
            types.append(getattr(loaded, name))
    return tuple(types)


def main(argv: list[str] | None = None) -> int:
    from opcore.config import ConfigError
    from opcore.plugins import PluginError

    try:
        parser, failures = build_parser()
    except (ConfigError, PluginError) as exc:  # strict mode, or a malformed switch
        print(f"opcore: error: {exc}", file=sys.stderr)
        return 2
    for failure in failures:
        print(f"opcore: warning: {failure.message}", file=sys.stderr)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    run = getattr(args, "run", None)
    if run is None:  # a command that failed half-way through add_parser (warned above)
        print(f"opcore {args.command}: error: this command is unavailable", file=sys.stderr)
        return 2
    try:
        return int(run(args) or 0)
    except _user_error_types() as exc:
        # User-facing configuration problems: one line, no traceback.
        print(f"opcore {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
