"""`OpcoreConfig`: the one explicit configuration object every hook receives.

Precedence, lowest first: dataclass defaults < the platform's
``apply_config_platform_defaults`` < environment (``OPCORE_IR_OP_PRIORITY``,
``OPCORE_CUSTOM_OPS``, ``OPCORE_ATTENTION_BACKEND``, ``OPCORE_COMPILATION_MODE``,
``OPCORE_BATCH_INVARIANT`` / ``OPCORE_DETERMINISTIC`` / ``OPCORE_CAPTURE_SAFE``) < explicit
arguments; then the platform's ``check_and_update_config`` has the last word.

Every core ``OPCORE_*`` variable is checked on the way (`check_environment`; names in
``OPCORE_CUSTOM_OPS`` and ``OPCORE_ATTENTION_BACKEND`` against what is registered, see
`check_custom_op_names`): a bad value is one `ConfigError` line naming the variable and the
bad part (docs/platforms.md, "Environment variables").

`create_config` builds one in that order. `set_current_config` makes one current for the
code that needs it implicitly (op dispatch, layer construction); `get_current_config`
builds one from the environment and the current platform the first time it is asked and
none was set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

# The switches, the plugin allow-list and ConfigError live in the leaf module `opcore.env`
# (plugin discovery reads them and must not import this module, which asks for the current
# platform); re-exported here.
from opcore.env import (
    SWITCH_VARIABLES,
    ConfigError,
    env_flag,
    parse_plugin_names,
)
from opcore.properties import PROPERTY_NAMES, check_names
from opcore.scopes import ScopeKind

if TYPE_CHECKING:
    from opcore.platforms import Platform

COMPILATION_MODES = ("eager", "inductor")
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
    """Validate a ``custom_ops`` list (or the comma-separated env form) and return it."""
    if isinstance(items, str):
        items = [i.strip() for i in items.split(",") if i.strip()]
    bases = [i for i in items if i in ("all", "none")]
    if len(bases) > 1:
        raise ConfigError(
            f"{source}: more than one base in {items!r}: use exactly one of all / none"
        )
    enabled: set[str] = set()
    disabled: set[str] = set()
    for item in items:
        if item in ("all", "none"):
            continue
        sign, name = item[:1], item[1:]
        if sign not in "+-" or not sign or not _NAME.match(name):
            raise ConfigError(f"{source}: {item!r} is not 'all', 'none', '+op' or '-op'")
        (enabled if sign == "+" else disabled).add(name)
    both = sorted(enabled & disabled)
    if both:
        raise ConfigError(f"{source}: {', '.join('+' + b + ' and -' + b for b in both)} both given")
    return list(items)


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


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Check the ``OPCORE_*`` variables of ``env`` (default ``os.environ``) that configure
    the process rather than the config object: the switches (`SWITCH_VARIABLES`), the
    plugin allow-list and, for ``os.environ``, the probe budget. A bad value is a
    `ConfigError` naming the variable and the bad part. `create_config` calls it; so does
    `opcore info` before resolution reads them."""
    env = os.environ if env is None else env
    for name in SWITCH_VARIABLES:
        env_flag(name, env)
    if (raw := env.get("OPCORE_PLUGINS")) is not None:
        parse_plugin_names(raw)
    if env is os.environ:  # the probe budget is read from the process environment only
        from opcore.platforms import PlatformResolutionError
        from opcore.platforms.resolution import probe_timeout_s

        try:
            probe_timeout_s()
        except PlatformResolutionError as exc:
            raise ConfigError(str(exc)) from None


# --------------------------------------------------------------------------- registered names
def _layer_op_names() -> list[str]:
    from opcore.layers import CustomOp, registered_layers

    return [n for n, (base, _oot) in registered_layers().items() if issubclass(base, CustomOp)]


def _attention_backend_names() -> list[str]:
    from opcore.attention.registry import known_names

    return known_names()


def _is_current_platform(platform: Platform | None) -> bool:
    from opcore import platforms

    return platform is None or (
        platforms.is_resolved() and platforms.get_current_platform() is platform
    )


_loading_names = threading.local()


def _check_registered(
    wanted: list[tuple[str, str]], list_known, *, what: str, source: str, platform
) -> None:
    """Each ``(shown, name)`` of ``wanted`` must name a registered ``what``.

    Plugins register names when the platform's kernels and the general plugins load, which
    happens lazily; so when a name is missing and the config is for the current platform,
    they are loaded first (`opcore.platforms.kernels.ensure_kernels_loaded`, once per
    process) and the names are checked again. For another platform the registry is taken as
    it stands."""
    if getattr(_loading_names, "active", False):
        # A config made while this thread loads the kernels for a name check (a kernel
        # module or import_kernels asked for one): the registry is incomplete until the
        # load ends, and the outer check runs then.
        return
    known = list_known()
    if all(name in known for _, name in wanted):
        return
    if _is_current_platform(platform):
        from opcore.platforms.kernels import ensure_kernels_loaded

        _loading_names.active = True
        try:
            ensure_kernels_loaded()
        finally:
            _loading_names.active = False
        known = list_known()
    for shown, name in wanted:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{source}: {shown!r} names no known {what}{hint}; "
                f"known: {', '.join(known) or 'none'}"
            )


def check_custom_op_names(
    items: list[str], *, source: str = "custom_ops", platform: Platform | None = None
) -> None:
    """Every ``+op`` / ``-op`` of a parsed ``custom_ops`` list must name a registered
    `opcore.layers.CustomOp` (a typo would otherwise be ignored in silence)."""
    wanted = [(item, item[1:]) for item in items if item not in ("all", "none")]
    if wanted:
        _check_registered(
            wanted, _layer_op_names, what="layer op", source=source, platform=platform
        )


def check_attention_backend_name(
    text: str, *, source: str = "attention.backend", platform: Platform | None = None
) -> None:
    """``text`` must be a registered attention backend name: the core's own or one a
    plugin registered (in its platform's ``import_kernels``, loaded first when needed).
    Whether that backend suits a layer is decided when one is selected."""
    _check_registered(
        [(text, text.upper())],
        _attention_backend_names,
        what="attention backend",
        source=source,
        platform=platform,
    )


# --------------------------------------------------------------------------- building
def apply_environment(
    config: OpcoreConfig, env: Mapping[str, str], platform: Platform | None = None
) -> None:
    """Check every core ``OPCORE_*`` variable of ``env`` (`check_environment`) and apply
    those the config holds to ``config``; names in ``OPCORE_CUSTOM_OPS`` and
    ``OPCORE_ATTENTION_BACKEND`` must be registered (for ``platform``, default: current)."""
    check_environment(env)
    for variable, name in PROPERTY_VARIABLES.items():
        if env_flag(variable, env) and name not in config.kernel.required_properties:
            config.kernel.required_properties.append(name)
    if raw := env.get("OPCORE_IR_OP_PRIORITY"):
        config.kernel.ir_op_priority.update(parse_ir_op_priority(raw))
    if raw := env.get("OPCORE_CUSTOM_OPS"):
        items = parse_custom_ops(raw, source="OPCORE_CUSTOM_OPS")
        check_custom_op_names(items, source="OPCORE_CUSTOM_OPS", platform=platform)
        config.compilation.custom_ops = items
    if raw := env.get("OPCORE_COMPILATION_MODE"):
        config.compilation.mode = parse_mode(raw, source="OPCORE_COMPILATION_MODE")
    if raw := env.get("OPCORE_ATTENTION_BACKEND"):
        name = parse_backend_name(raw, source="OPCORE_ATTENTION_BACKEND")
        check_attention_backend_name(raw, source="OPCORE_ATTENTION_BACKEND", platform=platform)
        config.attention.backend = name


def create_config(
    platform: Platform | None = None,
    *,
    custom_ops: list[str] | None = None,
    mode: str | None = None,
    ir_op_priority: Mapping[str, list[str]] | None = None,
    attention_backend: str | None = None,
    required_properties: list[str] | tuple[str, ...] | None = None,
    env: Mapping[str, str] | None = None,
) -> OpcoreConfig:
    """Build a config in precedence order, calling the platform hooks on it.

    Precedence, lowest first: defaults, the platform's
    ``apply_config_platform_defaults``, the ``OPCORE_*`` environment variables, then the
    keyword arguments; ``check_and_update_config`` sees the result last.

    Args:
        platform: the platform whose hooks run (default: the current platform).
        custom_ops: ``compilation.custom_ops`` items such as ``["none", "+rms_norm"]``.
        mode: the compilation mode.
        ir_op_priority: ``{op name: [provider, ...]}`` user priority lists.
        attention_backend: the attention backend name to use.
        required_properties: provider properties every op's provider must declare
            (replacing those the environment requires).
        env: the environment to read ``OPCORE_*`` from (default: ``os.environ``).

    Returns:
        A new `OpcoreConfig` (not made current: see `set_current_config`).

    Raises:
        ConfigError: a value or environment variable is malformed or names something
            unknown (the message names it).

    Examples:
        >>> from opcore.config import create_config
        >>> config = create_config(ir_op_priority={"rms_norm": ["native"]}, env={})
        >>> config.kernel.ir_op_priority["rms_norm"]
        ['native']
    """
    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    config = OpcoreConfig()
    platform.apply_config_platform_defaults(config)
    apply_environment(config, os.environ if env is None else env, platform)
    if custom_ops is not None:
        config.compilation.custom_ops = parse_custom_ops(list(custom_ops))
        check_custom_op_names(config.compilation.custom_ops, platform=platform)
    if mode is not None:
        config.compilation.mode = parse_mode(mode)
    if ir_op_priority is not None:
        for op, providers in ir_op_priority.items():
            if not _NAME.match(op):
                raise ConfigError(f"ir_op_priority: {op!r} is not a valid op name")
            config.kernel.ir_op_priority[op] = list(providers)
    if attention_backend is not None:
        config.attention.backend = parse_backend_name(attention_backend)
        check_attention_backend_name(attention_backend, platform=platform)
    if required_properties is not None:
        config.kernel.required_properties = parse_required_properties(required_properties)
    platform.check_and_update_config(config)
    config.kernel.required_properties = parse_required_properties(
        config.kernel.required_properties, source="kernel.required_properties"
    )
    return config


# Re-entrant: building the default config may load the kernels (a name check), and a
# kernel module that dispatches while imported asks for the current config again.
_default_lock = threading.RLock()
_default: OpcoreConfig | None = None
# The open set_current_config blocks of this thread / asyncio task (see opcore.scopes).
CONFIG_SCOPE = "config"  # their `opcore.scopes.Frame.kind`
_scopes = ScopeKind(CONFIG_SCOPE)
_generation = 0


def config_generation() -> int:
    """A process-wide counter bumped whenever a `set_current_config` block is entered or
    left in any thread. It says that something may have changed somewhere, not what is
    current here: caches of per-thread decisions key on `opcore.scopes.current_scopes()`
    and the config object instead."""
    return _generation


def get_current_config() -> OpcoreConfig:
    """The config of the innermost `set_current_config` block open in this thread or
    asyncio task, else the process default (built once from the environment and the
    current platform)."""
    config = _scopes.top()
    if config is not None:
        return config
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = create_config()
    return _default


@contextlib.contextmanager
def set_current_config(config: OpcoreConfig) -> Iterator[OpcoreConfig]:
    """Make ``config`` current inside the ``with`` block, for this thread or asyncio task
    only (other threads and tasks keep theirs). Blocks may be left in any order: leaving
    one removes exactly that block (a `contextvars` scope; see `opcore.scopes`)."""
    global _generation
    _generation += 1
    try:
        with _scopes.push(config):
            yield config
    finally:
        _generation += 1


# --------------------------------------------------------------------------- command line
def add_config_arguments(
    parser, platform: Platform | None = None, *, platform_options: bool = True
) -> None:
    """Add the `OpcoreConfig` options to an ``argparse`` parser, then let the platform add
    its own (``pre_register_and_update(parser)``) unless ``platform_options`` is false
    (for commands that must work before, or without, a resolved platform). Pair with
    `config_from_args`."""
    group = parser.add_argument_group("opcore configuration (override the OPCORE_* environment)")
    group.add_argument("--ir-op-priority", metavar="SPEC", help="e.g. 'rms_norm=triton,native'")
    group.add_argument("--custom-ops", metavar="LIST", help="e.g. 'none,+rms_norm'")
    group.add_argument("--compilation-mode", choices=COMPILATION_MODES)
    group.add_argument("--attention-backend", metavar="NAME")
    group.add_argument(
        "--require-properties",
        metavar="LIST",
        help=f"provider properties every op must have, e.g. 'batch_invariant' "
        f"(known: {', '.join(PROPERTY_NAMES)})",
    )
    if not platform_options:
        return
    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    platform.pre_register_and_update(parser)


def config_from_args(args, platform: Platform | None = None) -> OpcoreConfig:
    """`create_config` from options added by `add_config_arguments`."""
    priority = getattr(args, "ir_op_priority", None)
    custom_ops = getattr(args, "custom_ops", None)
    required = getattr(args, "require_properties", None)
    return create_config(
        platform,
        ir_op_priority=parse_ir_op_priority(priority, source="--ir-op-priority")
        if priority
        else None,
        custom_ops=parse_custom_ops(custom_ops, source="--custom-ops") if custom_ops else None,
        mode=getattr(args, "compilation_mode", None),
        attention_backend=getattr(args, "attention_backend", None),
        required_properties=parse_required_properties(required, source="--require-properties")
        if required
        else None,
    )
