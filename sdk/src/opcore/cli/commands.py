"""The ``opcore.cli_commands`` entry-point group: where `opcore`'s subcommands come from.

Contract for a distribution that adds a command: an entry point in the group, named as the
command, whose value is an object (usually a module) with ``add_parser(subparsers)``. That
function adds one subparser of exactly that name to ``subparsers`` (an argparse
sub-parsers action) and sets its ``run`` default to a function ``run(args) -> int``. The
object is imported every time the parser is built, ``opcore --help`` included, so it must
import nothing heavy: torch and the command's dependencies belong inside ``run``.

A command name belongs to one distribution: the core's (``opcore``) are added first and
keep their names; of two other distributions declaring one name, the first by
distribution name keeps it and the other is refused. A command that fails (its import or
``add_parser`` raises, it adds no subparser of its name, or its name is taken) is a
`CommandFailure`, one line naming the distribution; the other commands are unaffected.
Under ``OPCORE_STRICT_PLUGINS=1`` the first failure raises `opcore.plugins.PluginError`.
``OPCORE_PLUGINS`` does not filter commands: it selects platform and general plugins.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata as md

GROUP = "opcore.cli_commands"
CORE_DISTRIBUTION = "opcore"


@dataclasses.dataclass(frozen=True)
class CommandEntry:
    """One installed entry point of the group."""

    name: str
    value: str
    distribution: str | None
    version: str | None
    entry_point: md.EntryPoint = dataclasses.field(repr=False, compare=False)

    def where(self) -> str:
        """``"distribution version"``, or the entry point's value without a distribution."""
        return f"{self.distribution} {self.version}" if self.distribution else self.value


@dataclasses.dataclass(frozen=True)
class CommandFailure:
    """A command that is not available, and why (one line)."""

    name: str
    distribution: str | None
    message: str


def installed() -> list[CommandEntry]:
    """Every entry point of the group, the core's first, then by (name, distribution).
    A distribution seen twice on ``sys.path`` counts once."""
    seen: dict[tuple[str, str | None], CommandEntry] = {}
    for ep in md.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        name = dist.metadata["Name"] if dist is not None else None
        seen.setdefault(
            (ep.name, name),
            CommandEntry(ep.name, ep.value, name, dist.version if dist else None, ep),
        )
    return sorted(
        seen.values(),
        key=lambda e: (e.distribution != CORE_DISTRIBUTION, e.name, e.distribution or ""),
    )


def _add_one(entry: CommandEntry, subparsers: argparse._SubParsersAction, owners: dict) -> None:
    """Add ``entry``'s subparser; raises with the reason when it cannot."""
    owner = owners.get(entry.name)
    if owner is not None:
        raise LookupError(
            f"the command name belongs to {owner.where()}; {entry.where()} declares it too "
            f"and is refused (rename its entry point)"
        )
    target = entry.entry_point.load()
    add_parser = getattr(target, "add_parser", None)
    if not callable(add_parser):
        raise TypeError(f"{entry.value} has no add_parser(subparsers)")
    add_parser(subparsers)
    if entry.name not in subparsers.choices:
        raise LookupError(f"{entry.value}.add_parser added no subcommand named {entry.name!r}")
    owners[entry.name] = entry


def add_commands(subparsers: argparse._SubParsersAction) -> list[CommandFailure]:
    """Add every installed command to ``subparsers``; return the ones that failed.

    Raises:
        opcore.plugins.PluginError: under ``OPCORE_STRICT_PLUGINS=1``, the first failure.
        opcore.config.ConfigError: ``OPCORE_STRICT_PLUGINS`` is malformed (only asked
            when a command failed).
    """
    failures: list[CommandFailure] = []
    owners: dict[str, CommandEntry] = {}
    for entry in installed():
        try:
            _add_one(entry, subparsers, owners)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: one command never ends the CLI
            failure = CommandFailure(
                entry.name,
                entry.distribution,
                f"command {entry.name!r} ({GROUP}, from {entry.where()}) is unavailable: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())}",
            )
            from opcore.plugins import PluginError, strict_plugins

            if strict_plugins():
                raise PluginError(
                    failure.message + " [OPCORE_STRICT_PLUGINS=1 makes this fatal]"
                ) from exc
            failures.append(failure)
    return failures
