"""Effective provider priority per op, kernel loading, and explanations.

Merge rule (DESIGN §3), for op ``o`` under config ``c`` on the current platform ``p``:

1. the user list: ``o.set_priority([...])`` inside its block (the innermost one open in
   this thread or asyncio task), else ``c.kernel.ir_op_priority[o]`` (which includes
   ``OPCORE_IR_OP_PRIORITY``); a name that is not a registered provider is a
   ``ValueError`` listing the registered ones;
2. then ``p.get_default_ir_op_priority(c)[o]``, minus names already listed; a name that is
   not registered or not supported here is skipped and warned about once;
3. providers not supported here are dropped (a user-named one is warned about once);
4. the list is cut after the first provider that accepts every argument
   (``supports_args is None``); if there is none, ``native`` is appended, with a warning
   when the user's list was the reason.

Kernels are loaded once, lazily, before the first decision and before any provider name
is checked (`set_priority`, `explain`, `effective_priority`, the config's list):
``p.import_kernels()``, then ``p.import_ir_kernels()``, then the general plugins. So
whether a name is known never depends on whether something was dispatched before.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opcore.ir import op as _op

if TYPE_CHECKING:
    from opcore.ir.op import Impl, IrOp

logger = logging.getLogger("opcore.ir")


class PriorityWarning(UserWarning):
    """A priority entry could not be honoured (missing or unsupported provider, or native
    had to be appended)."""


_warned: set[tuple] = set()
# (config, registry generation) for which unknown op names were last checked
_last_ops_check: list[tuple[Any, int] | None] = [None]
_warn_lock = threading.Lock()


def warn_once(key: tuple, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message)
    warnings.warn(message, PriorityWarning, stacklevel=4)


# --------------------------------------------------------------------------- kernels
_kernels_lock = threading.RLock()
_kernels_state = {"loaded": False, "loading": False, "errors": []}


def ensure_kernels_loaded() -> None:
    """Import the current platform's kernels and IR providers and run the general
    plugins, once per process. A failure is recorded (see `kernel_load_errors`) and warned
    about; ``OPCORE_STRICT_PLUGINS=1`` makes it fatal."""
    if _kernels_state["loaded"]:
        return
    with _kernels_lock:
        if _kernels_state["loaded"] or _kernels_state["loading"]:
            return  # loaded, or a kernel module dispatches while being imported
        _kernels_state["loading"] = True
        try:
            from opcore.platforms import get_current_platform
            from opcore.plugins import load_general_plugins, strict_plugins

            platform = get_current_platform()
            for hook in ("import_kernels", "import_ir_kernels"):
                try:
                    getattr(platform, hook)()
                except Exception as exc:
                    message = (
                        f"platform {platform.name!r}: {hook}() failed: {type(exc).__name__}: {exc}; "
                        f"its providers are missing"
                    )
                    _kernels_state["errors"].append(message)
                    if strict_plugins():
                        raise RuntimeError(message + " [OPCORE_STRICT_PLUGINS=1 makes this fatal]") from exc
                    logger.warning(message)
                    warnings.warn(message, PriorityWarning, stacklevel=3)
            load_general_plugins()
            _kernels_state["loaded"] = True
        finally:
            _kernels_state["loading"] = False
        _op.bump_generation()


def kernel_load_errors() -> list[str]:
    return list(_kernels_state["errors"])


def log_dispatch_enabled() -> bool:
    enabled = _op.env_flag("OPCORE_LOG_DISPATCH")
    if enabled:
        dl = _op.dispatch_logger
        if dl.level == logging.NOTSET or dl.level > logging.INFO:
            dl.setLevel(logging.INFO)
        if not dl.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
            dl.addHandler(handler)
    return enabled


def check_ops_named(config: Any, generation: int) -> None:
    """`warn_unknown_ops` for ``config`` on the current platform, once per config object
    and registry generation."""
    last = _last_ops_check[0]
    if last is not None and last[0] is config and last[1] == generation:
        return
    from opcore.platforms import get_current_platform

    warn_unknown_ops(config, get_current_platform())
    _last_ops_check[0] = (config, generation)


def warn_unknown_ops(config: Any, platform: Any) -> None:
    """Warn once about priority entries for ops that are not registered (a typo such as
    ``rms_nrom=triton`` would otherwise be ignored)."""
    from opcore.ir.op import all_ops

    known = all_ops()
    for op_name in config.kernel.ir_op_priority:
        if op_name not in known:
            warn_once(
                ("unknown-op", "user", op_name),
                f"config.kernel.ir_op_priority / OPCORE_IR_OP_PRIORITY names op {op_name!r}, "
                f"which is not registered (registered: {', '.join(known)}); the entry is ignored",
            )
    for op_name in platform.get_default_ir_op_priority(config) or {}:
        if op_name not in known:
            warn_once(
                ("unknown-op", platform.name, op_name),
                f"platform {platform.name!r} default priority names op {op_name!r}, which is "
                f"not registered (registered: {', '.join(known)}); the entry is ignored",
            )


# --------------------------------------------------------------------------- decision
@dataclasses.dataclass
class Decision:
    """How an op's chain was built. ``names``/``chain``: the providers tried, in order.
    ``skipped``: provider -> reason, for registered providers not in the chain."""

    op: str
    user: list[str]
    user_source: str
    platform_default: list[str]
    names: list[str]
    chain: tuple[Impl, ...]
    native_appended: bool
    skipped: dict[str, str]


def _current_config() -> Any:
    from opcore.config import get_current_config

    return get_current_config()


_CURRENT = object()


def decide(op: IrOp, config: Any = None, platform: Any = None, *, override: Any = _CURRENT) -> Decision:
    """The chain of ``op`` under ``config`` (default: current) on ``platform`` (default:
    current), with ``override`` as the `set_priority` list (default: the block open in
    this thread or task; ``None``: none). Loads the platform's kernels first. Raises
    ``ValueError`` when the user list names an unknown provider."""
    ensure_kernels_loaded()
    if override is _CURRENT:
        override = op.priority_override()
    if config is None:
        config = _current_config()
    if platform is None:
        from opcore.platforms import get_current_platform

        platform = get_current_platform()
    if override is not None:
        user, source = list(override), "set_priority"
        # set_priority checked the names when its block began: a missing one was removed since
        op._check_known(user, source=source, in_force=True)
    else:
        user = list(config.kernel.ir_op_priority.get(op.name, []))
        source = "config.kernel.ir_op_priority / OPCORE_IR_OP_PRIORITY"
        op._check_known(user, source=source)
    defaults: Mapping[str, list[str]] = platform.get_default_ir_op_priority(config) or {}
    platform_list = list(defaults.get(op.name, []))

    skipped: dict[str, str] = {}
    merged: list[str] = []
    for name in user:
        if name in merged:
            continue
        if not op.impls[name].supported:
            skipped[name] = "not supported here (supported=False)"
            warn_once(
                ("user-unsupported", op.name, name),
                f"op {op.name!r}: priority ({source}) names provider {name!r}, which is not "
                f"supported on this machine; it is skipped",
            )
            continue
        merged.append(name)
    for name in platform_list:
        if name in merged or name in skipped:
            continue
        impl = op.impls.get(name)
        if impl is None:
            skipped[name] = f"named by platform {platform.name!r} default but not registered"
            warn_once(
                ("platform-missing", platform.name, op.name, name),
                f"op {op.name!r}: platform {platform.name!r} default priority names provider "
                f"{name!r}, which is not registered (registered: {', '.join(op.impls)}); it is skipped",
            )
            continue
        if not impl.supported:
            skipped[name] = "not supported here (supported=False)"
            warn_once(
                ("platform-unsupported", platform.name, op.name, name),
                f"op {op.name!r}: platform {platform.name!r} default priority names provider "
                f"{name!r}, which is not supported on this machine; it is skipped",
            )
            continue
        merged.append(name)

    names: list[str] = []
    for name in merged:
        names.append(name)
        if op.impls[name].supports_args is None:
            break
    native_appended = False
    if not names or op.impls[names[-1]].supports_args is not None:
        names.append("native")
        native_appended = True
        if user:
            warn_once(
                ("native-appended", op.name, tuple(user)),
                f"op {op.name!r}: no provider in the priority {user} ({source}) accepts all "
                f"arguments; 'native' was appended as the last resort. Add 'native' (or a "
                f"provider without supports_args) to the list to silence this warning",
            )
    for name in merged[len(names):]:
        skipped.setdefault(name, f"after {names[-1]!r}, which accepts every argument")
    for name in op.impls:
        if name not in names and name not in skipped:
            skipped[name] = (
                "not supported here (supported=False)" if not op.impls[name].supported else "not in the priority list"
            )
    return Decision(
        op=op.name,
        user=user,
        user_source=source,
        platform_default=platform_list,
        names=names,
        chain=tuple(op.impls[n] for n in names),
        native_appended=native_appended,
        skipped=skipped,
    )


# --------------------------------------------------------------------------- explain
@dataclasses.dataclass
class Explanation:
    """``selected``: the provider that runs (``None`` when explaining without arguments).
    ``providers``: every registered provider with a status (``selected``, ``tried``
    (supports_args returned False), ``not supported``, ``not in list``, ``not reached``,
    ``in list``) and the reason."""

    op: str
    selected: str | None
    priority: list[str]
    user: list[str]
    platform_default: list[str]
    native_appended: bool
    providers: list[dict[str, str]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        head = f"op {self.op}: priority {self.priority}"
        if self.selected is not None:
            head += f" -> {self.selected}"
        lines = [head, f"  user list: {self.user or '-'}; platform default: {self.platform_default or '-'}"
                 + ("; native appended" if self.native_appended else "")]
        for p in self.providers:
            lines.append(f"  {p['provider']:<12} {p['status']:<14} {p['reason']}")
        return "\n".join(lines)


def explain(op: IrOp, args: tuple, kwargs: Mapping[str, Any]) -> Explanation:
    decision: Decision = op.decision()  # loads the kernels first
    rows: dict[str, dict[str, str]] = {}
    selected = None
    if args or kwargs:
        for impl in decision.chain:
            if selected is not None:
                rows[impl.provider] = {"status": "not reached", "reason": f"{selected!r} comes first"}
                continue
            if impl.supports_args is None:
                selected = impl.provider
                rows[impl.provider] = {"status": "selected", "reason": "accepts every argument"}
                continue
            ok = impl.supports_args(*args, **kwargs)
            if ok is True:
                selected = impl.provider
                rows[impl.provider] = {"status": "selected", "reason": "supports_args returned True"}
            else:
                rows[impl.provider] = {"status": "tried", "reason": f"supports_args returned {ok!r}"}
    else:
        for impl in decision.chain:
            rows[impl.provider] = {"status": "in list", "reason": f"position {decision.names.index(impl.provider)}"}
    for name, reason in decision.skipped.items():
        if name in rows:
            continue
        status = "not supported" if "not supported" in reason else "not in list"
        rows[name] = {"status": status, "reason": reason}
    providers = [{"provider": name, **row} for name, row in rows.items()]
    return Explanation(
        op=op.name,
        selected=selected,
        priority=list(decision.names),
        user=list(decision.user),
        platform_default=list(decision.platform_default),
        native_appended=decision.native_appended,
        providers=providers,
    )
