"""`OpcoreConfig`: the one explicit configuration object every hook receives, and its parsing.

This module is a value and nothing more: the dataclasses, the parsers of every form a
setting takes (environment, command line, keyword argument) and the ``custom_ops`` rule.
It imports nothing of opcore but the leaves `opcore.env` and `opcore.properties`, so every
layer may read a config (docs/design.md#layers-and-imports).

Building one for a platform (`opcore.settings.create_config`: defaults, the platform's
hooks, the ``OPCORE_*`` environment, explicit arguments, names checked against what is
registered) and holding the current one (`opcore.settings.get_current_config`,
`opcore.settings.set_current_config`) need the platforms and the registries; they live in
`opcore.settings`, which imports this module.
"""

from __future__ import annotations

import dataclasses
import re

# The switches, the plugin allow-list and ConfigError live in the leaf module `opcore.env`
# (plugin discovery reads them before any config exists); re-exported here.
from opcore.env import (
    SWITCH_VARIABLES,
    ConfigError,
    env_flag,
    parse_plugin_names,
)
from opcore.properties import PROPERTY_NAMES, check_names

__all__ = [
    "COMPILATION_MODES",
    "CUSTOM_OPS_BASES",
    "PROPERTY_VARIABLES",
    "SWITCH_VARIABLES",
    "AttentionConfig",
    "CompilationConfig",
    "ConfigError",
    "KernelConfig",
    "OpcoreConfig",
    "custom_op_enabled",
    "env_flag",
    "parse_backend_name",
    "parse_custom_ops",
    "parse_ir_op_priority",
    "parse_mode",
    "parse_op_name",
    "parse_plugin_names",
    "parse_required_properties",
]

COMPILATION_MODES = ("eager", "inductor")
CUSTOM_OPS_BASES = ("all", "none")
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_BACKEND_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass
class CompilationConfig:
    """``custom_ops``: a list like ``["none", "+rms_norm"]``: at most one base (``all`` or
    ``none``), then ``+op`` / ``-op``. Empty means the mode's default base (``all`` in
    eager, ``none`` under inductor, so Inductor sees the native code it can fuse).
    ``mode``: ``eager`` or ``inductor``."""

    custom_ops: list[str] = dataclasses.field(default_factory=list)
    mode: str = "eager"


@dataclasses.dataclass
class KernelConfig:
    """``ir_op_priority``: ``{op: [provider, ...]}``, the user's order, tried before the
    platform default (docs/design.md#priority-rule). ``required_properties``: provider
    properties (`opcore.properties.PROPERTY_NAMES`) every op's chosen provider must
    declare (docs/properties.md); set by ``OPCORE_BATCH_INVARIANT`` and the like."""

    ir_op_priority: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    required_properties: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class AttentionConfig:
    """``backend``: an attention backend name to use (validated, never replaced), or
    ``None`` to let the platform's candidates decide."""

    backend: str | None = None


@dataclasses.dataclass
class OpcoreConfig:
    compilation: CompilationConfig = dataclasses.field(default_factory=CompilationConfig)
    kernel: KernelConfig = dataclasses.field(default_factory=KernelConfig)
    attention: AttentionConfig = dataclasses.field(default_factory=AttentionConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- parsing
def parse_ir_op_priority(
    text: str, *, source: str = "OPCORE_IR_OP_PRIORITY"
) -> dict[str, list[str]]:
    """Parse ``"rms_norm=triton,native;silu_and_mul=native"`` into a mapping."""
    out: dict[str, list[str]] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        op, eq, providers = part.partition("=")
        op = op.strip()
        if not eq:
            raise ConfigError(f"{source}: {part.strip()!r} is not of the form op=provider,provider")
        if not _NAME.match(op):
            raise ConfigError(
                f"{source}: op name {op!r} in {part.strip()!r} is not a valid op name"
            )
        if op in out:
            raise ConfigError(f"{source}: op {op!r} is given twice")
        names = [p.strip() for p in providers.split(",")]
        for name in names:
            if not _NAME.match(name):
                raise ConfigError(
                    f"{source}: provider {name!r} in {part.strip()!r} is not a valid provider name"
                )
        out[op] = names
    return out


def parse_custom_ops(items: list[str] | str, *, source: str = "custom_ops") -> list[str]:
    """Validate a ``custom_ops`` list (or the comma-separated env form) and return it: at
    most one base (`CUSTOM_OPS_BASES`), then ``+op`` / ``-op`` items, no op both enabled
    and disabled. Whether the names are registered layer ops is checked where a config is
    built (`opcore.settings.create_config`)."""
    if isinstance(items, str):
        items = [i.strip() for i in items.split(",") if i.strip()]
    bases = [i for i in items if i in CUSTOM_OPS_BASES]
    if len(bases) > 1:
        raise ConfigError(
            f"{source}: more than one base in {items!r}: use exactly one of all / none"
        )
    enabled: set[str] = set()
    disabled: set[str] = set()
    for item in items:
        if item in CUSTOM_OPS_BASES:
            continue
        sign, name = item[:1], item[1:]
        if sign not in "+-" or not sign or not _NAME.match(name):
            raise ConfigError(f"{source}: {item!r} is not 'all', 'none', '+op' or '-op'")
        (enabled if sign == "+" else disabled).add(name)
    both = sorted(enabled & disabled)
    if both:
        raise ConfigError(f"{source}: {', '.join('+' + b + ' and -' + b for b in both)} both given")
    return list(items)


def custom_op_enabled(compilation: CompilationConfig, name: str) -> tuple[bool, str]:
    """Whether ``compilation.custom_ops`` enables layer op ``name``, and why: ``-name`` or
    ``+name`` decide; else the base (``all`` / ``none``); with no base the mode's default
    (``all`` in eager, ``none`` under inductor, so Inductor sees native code it can fuse).

    Raises:
        ConfigError: the list breaks a rule of `parse_custom_ops` (it may have been set
            on the dataclass directly).
    """
    items = parse_custom_ops(list(compilation.custom_ops))
    if f"-{name}" in items:
        return False, f"disabled by '-{name}'"
    if f"+{name}" in items:
        return True, f"enabled by '+{name}'"
    bases = [i for i in items if i in CUSTOM_OPS_BASES]
    if bases:
        return bases[0] == "all", f"base {bases[0]!r}"
    base = "none" if compilation.mode == "inductor" else "all"
    return base == "all", f"default base {base!r} for mode {compilation.mode!r}"


def parse_op_name(text: object, *, source: str = "ir_op_priority") -> str:
    """``text`` when it is a valid op name (``^[a-z_][a-z0-9_]*$``)."""
    if not isinstance(text, str) or not _NAME.match(text):
        raise ConfigError(f"{source}: {text!r} is not a valid op name")
    return text


def parse_mode(text: str, *, source: str = "compilation.mode") -> str:
    if text not in COMPILATION_MODES:
        raise ConfigError(f"{source}: {text!r} is not one of {', '.join(COMPILATION_MODES)}")
    return text


def parse_backend_name(text: str, *, source: str = "attention.backend") -> str:
    if not _BACKEND_NAME.match(text):
        raise ConfigError(f"{source}: {text!r} is not a backend name")
    return text.upper()


# One switch per provider property: OPCORE_BATCH_INVARIANT=1 requires batch_invariant.
PROPERTY_VARIABLES = {f"OPCORE_{name.upper()}": name for name in PROPERTY_NAMES}


def parse_required_properties(
    items: list[str] | tuple[str, ...] | str, *, source: str = "required_properties"
) -> list[str]:
    """A list of property names (or the comma-separated form), each known, no repeats."""
    if isinstance(items, str):
        items = [i.strip() for i in items.split(",") if i.strip()]
    try:
        return check_names(items, where=source)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# What moved to `opcore.settings` (building a config for a platform, the current config,
# the name checks): an import of it from here says where it went instead of "cannot import
# name". ImportError rather than AttributeError, because `from opcore.config import x`
# turns an AttributeError into a message that drops ours.
_MOVED_TO_SETTINGS = frozenset(
    {
        "CONFIG_SCOPE",
        "add_config_arguments",
        "apply_environment",
        "check_attention_backend_name",
        "check_custom_op_names",
        "check_environment",
        "config_from_args",
        "config_generation",
        "create_config",
        "get_current_config",
        "set_current_config",
    }
)


def __getattr__(name: str):
    if name in _MOVED_TO_SETTINGS:
        raise ImportError(
            f"opcore.config.{name} is opcore.settings.{name}: opcore.config holds the config "
            "value only (docs/design.md#layers-and-imports)",
            name="opcore.config",
        )
    raise AttributeError(f"module 'opcore.config' has no attribute {name!r}")
