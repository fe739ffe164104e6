"""The config in use: building an `opcore.config.OpcoreConfig` for a platform, and the
current one.

Precedence, lowest first: dataclass defaults < the platform's
``apply_config_platform_defaults`` < environment (``OPCORE_IR_OP_PRIORITY``,
``OPCORE_CUSTOM_OPS``, ``OPCORE_ATTENTION_BACKEND``, ``OPCORE_COMPILATION_MODE``,
``OPCORE_BATCH_INVARIANT`` / ``OPCORE_DETERMINISTIC`` / ``OPCORE_CAPTURE_SAFE``) < explicit
arguments; then the platform's ``check_and_update_config`` has the last word.

Every core ``OPCORE_*`` variable is checked on the way (`check_environment`): a bad value
is one `ConfigError` line naming the variable and the bad part (docs/platforms.md,
"Environment variables").

Names a config holds must be registered: each ``+op`` / ``-op`` of ``custom_ops`` a layer
op (`opcore.layers.CustomOp`), ``attention.backend`` an attention backend. The registries
sit above this module (docs/design.md#layers-and-imports), so they hand it their names:
`opcore.layers` and `opcore.attention.registry` call `register_name_source` when they are
imported. A name is checked when its config is built if its registry is loaded by then,
else when that registry first serves the config (a layer is built, a backend is selected:
`check_pending_names`), with the same message.

`create_config` builds a config in that order. `set_current_config` makes one current for
the code that needs it implicitly (op dispatch, layer construction); `get_current_config`
builds one from the environment and the current platform the first time it is asked and
none was set.

The value itself (the dataclasses and their parsers) is `opcore.config`, which imports
nothing of the layers above it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from opcore.config import (
    COMPILATION_MODES,
    CUSTOM_OPS_BASES,
    PROPERTY_VARIABLES,
    SWITCH_VARIABLES,
    ConfigError,
    OpcoreConfig,
    env_flag,
    parse_backend_name,
    parse_custom_ops,
    parse_ir_op_priority,
    parse_mode,
    parse_op_name,
    parse_plugin_names,
    parse_required_properties,
)
from opcore.properties import PROPERTY_NAMES
from opcore.scopes import ScopeKind

if TYPE_CHECKING:
    from opcore.platforms import Platform

__all__ = [
    "ATTENTION_BACKENDS",
    "CONFIG_SCOPE",
    "LAYER_OPS",
    "add_config_arguments",
    "check_environment",
    "check_pending_names",
    "config_from_args",
    "config_generation",
    "create_config",
    "get_current_config",
    "register_name_source",
    "set_current_config",
]


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
LAYER_OPS = "layer op"  # the names of `opcore.layers.CustomOp` layers (custom_ops items)
ATTENTION_BACKENDS = "attention backend"  # the names of `opcore.attention.registry`

_name_sources: dict[str, Callable[[], Iterable[str]]] = {}


def register_name_source(kind: str, names: Callable[[], Iterable[str]]) -> None:
    """Check a config's names of ``kind`` (`LAYER_OPS`, `ATTENTION_BACKENDS`) against
    ``names()``, the names registered at the time of the check. A registry calls this
    once, when it is imported; calling it again replaces the source."""
    _name_sources[kind] = names


@dataclasses.dataclass(frozen=True)
class _Wanted:
    """A name a config holds that must be registered."""

    kind: str
    shown: str  # as written, e.g. "+rms_norm"
    name: str  # as registered, e.g. "rms_norm"
    source: str  # what set it, named in the message, e.g. "OPCORE_CUSTOM_OPS"


# Names whose registry was not loaded when their config was built, by id(config): checked
# when that registry first serves the config, forgotten with the config.
_pending: dict[int, tuple[list[_Wanted], Platform | None]] = {}
_pending_lock = threading.Lock()
_loading_names = threading.local()


def _is_current_platform(platform: Platform | None) -> bool:
    from opcore import platforms

    return platform is None or (
        platforms.is_resolved() and platforms.get_current_platform() is platform
    )


def _known(kind: str) -> list[str]:
    return list(_name_sources[kind]())


def _unknown(wanted: list[_Wanted]) -> list[_Wanted]:
    return [w for w in wanted if w.kind in _name_sources and w.name not in _known(w.kind)]


def _check_names(wanted: list[_Wanted], platform: Platform | None) -> list[_Wanted]:
    """Check each of ``wanted`` whose registry supplies names; return the others.

    Plugins register names when the platform's kernels and the general plugins load, which
    happens lazily; so when a name is missing and the config is for the current platform,
    they are loaded first (`opcore.platforms.kernels.ensure_kernels_loaded`, once per
    process) and the names are checked again. For another platform the registries are
    taken as they stand."""
    if getattr(_loading_names, "active", False):
        # A config made while this thread loads the kernels for a name check (a kernel
        # module or import_kernels asked for one): the registries are incomplete until
        # the load ends, and the outer check runs then.
        return []
    if _unknown(wanted) and _is_current_platform(platform):
        from opcore.platforms.kernels import ensure_kernels_loaded

        _loading_names.active = True
        try:
            ensure_kernels_loaded()
        finally:
            _loading_names.active = False
    for w in _unknown(wanted):  # a kernel hook may also have loaded a registry
        known = _known(w.kind)
        close = difflib.get_close_matches(w.name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{w.source}: {w.shown!r} names no known {w.kind}{hint}; "
            f"known: {', '.join(known) or 'none'}"
        )
    return [w for w in wanted if w.kind not in _name_sources]


def _forget(key: int) -> None:
    with _pending_lock:
        _pending.pop(key, None)


def _check_or_defer(config: OpcoreConfig, wanted: list[_Wanted], platform) -> None:
    later = _check_names(wanted, platform)
    if later:
        with _pending_lock:
            _pending[id(config)] = (later, platform)
        weakref.finalize(config, _forget, id(config))


def check_pending_names(config: OpcoreConfig, kind: str) -> None:
    """Check the names of ``kind`` that ``config`` held when it was built, before the
    registry of ``kind`` was loaded. That registry calls this when it serves ``config``;
    a config with nothing pending costs one dictionary lookup.

    Raises:
        ConfigError: a name is not registered (the message names what set it); the name
            stays pending, so every later use raises too.
    """
    entry = _pending.get(id(config))
    if entry is None:
        return
    wanted, platform = entry
    mine = [w for w in wanted if w.kind == kind]
    if not mine:
        return
    _check_names(mine, platform)
    with _pending_lock:
        rest = [w for w in wanted if w.kind != kind]
        if rest:
            _pending[id(config)] = (rest, platform)
        else:
            _pending.pop(id(config), None)


def _custom_op_names(items: list[str], source: str) -> list[_Wanted]:
    return [_Wanted(LAYER_OPS, i, i[1:], source) for i in items if i not in CUSTOM_OPS_BASES]


# --------------------------------------------------------------------------- building
def _apply_environment(config: OpcoreConfig, env: Mapping[str, str]) -> list[_Wanted]:
    """Check every core ``OPCORE_*`` variable of ``env`` (`check_environment`) and apply
    those the config holds to ``config``; returns the names they give that must be
    registered."""
    check_environment(env)
    wanted: list[_Wanted] = []
    for variable, name in PROPERTY_VARIABLES.items():
        if env_flag(variable, env) and name not in config.kernel.required_properties:
            config.kernel.required_properties.append(name)
    if raw := env.get("OPCORE_IR_OP_PRIORITY"):
        config.kernel.ir_op_priority.update(parse_ir_op_priority(raw))
    if raw := env.get("OPCORE_CUSTOM_OPS"):
        items = parse_custom_ops(raw, source="OPCORE_CUSTOM_OPS")
        wanted += _custom_op_names(items, "OPCORE_CUSTOM_OPS")
        config.compilation.custom_ops = items
    if raw := env.get("OPCORE_COMPILATION_MODE"):
        config.compilation.mode = parse_mode(raw, source="OPCORE_COMPILATION_MODE")
    if raw := env.get("OPCORE_ATTENTION_BACKEND"):
        name = parse_backend_name(raw, source="OPCORE_ATTENTION_BACKEND")
        wanted.append(_Wanted(ATTENTION_BACKENDS, raw, name, "OPCORE_ATTENTION_BACKEND"))
        config.attention.backend = name
    return wanted


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
        >>> from opcore.settings import create_config
        >>> config = create_config(ir_op_priority={"rms_norm": ["native"]}, env={})
        >>> config.kernel.ir_op_priority["rms_norm"]
        ['native']
    """
    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    config = OpcoreConfig()
    platform.apply_config_platform_defaults(config)
    wanted = _apply_environment(config, os.environ if env is None else env)
    if custom_ops is not None:
        config.compilation.custom_ops = parse_custom_ops(list(custom_ops))
        wanted += _custom_op_names(config.compilation.custom_ops, "custom_ops")
    if mode is not None:
        config.compilation.mode = parse_mode(mode)
    if ir_op_priority is not None:
        for op, providers in ir_op_priority.items():
            config.kernel.ir_op_priority[parse_op_name(op)] = list(providers)
    if attention_backend is not None:
        config.attention.backend = parse_backend_name(attention_backend)
        wanted.append(
            _Wanted(
                ATTENTION_BACKENDS, attention_backend, config.attention.backend, "attention.backend"
            )
        )
    if required_properties is not None:
        config.kernel.required_properties = parse_required_properties(required_properties)
    _check_or_defer(config, wanted, platform)
    platform.check_and_update_config(config)
    config.kernel.required_properties = parse_required_properties(
        config.kernel.required_properties, source="kernel.required_properties"
    )
    return config


# --------------------------------------------------------------------------- the current config
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
