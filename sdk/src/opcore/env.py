"""The process switches and the plugin allow-list read from ``OPCORE_*`` variables.

A leaf module (it imports nothing of opcore), so that plugin discovery and platform
resolution read their variables before any config exists: the dependency points one way,
settings -> platforms -> plugins -> env (docs/design.md#layers-and-imports).
`opcore.config` re-exports every name here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class ConfigError(ValueError):
    """A malformed configuration value; the message quotes the bad part."""


# Its public home is opcore.config (tracebacks and docs name it there).
ConfigError.__module__ = "opcore.config"


FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off")
# The on/off switches the core reads (outside the config object).
SWITCH_VARIABLES = ("OPCORE_STRICT_PLUGINS", "OPCORE_LOG_DISPATCH", "OPCORE_IR_CHECK_VALUES")


def parse_flag(text: str, *, source: str) -> bool:
    """An on/off switch: ``1``, ``true``, ``yes``, ``on`` or ``0``, ``false``, ``no``,
    ``off`` (any case; empty means off). Anything else is a `ConfigError` listing them."""
    value = text.strip().lower()
    if value in FLAG_ON:
        return True
    if value in FLAG_OFF or not value:
        return False
    raise ConfigError(
        f"{source}: {text!r} is not a switch value; use {', '.join(FLAG_ON)} (on) or "
        f"{', '.join(FLAG_OFF)}, or leave it empty (off)"
    )


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """The switch ``name`` in ``env`` (default ``os.environ``), parsed by `parse_flag`;
    unset is off. Every reader of a core switch uses this, so all agree on its values."""
    return parse_flag((os.environ if env is None else env).get(name, ""), source=name)


def parse_plugin_names(text: str, *, source: str = "OPCORE_PLUGINS") -> list[str]:
    """The comma-separated plugin allow-list: names, none of them empty."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise ConfigError(
            f"{source}: {text!r} has an empty name; give plugin names separated by commas, "
            f"e.g. 'cpu,acme' (unset it to load every plugin)"
        )
    return names
