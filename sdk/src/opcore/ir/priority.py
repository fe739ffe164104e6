"""The priority rule: which providers of an op are tried, in which order, and why.

`decide` is a pure function of public data: the op's name and registered providers
(`opcore.ir.op.Impl`), the user list and where it came from, the platform's default list
and the platform's name. It reads no config, platform or registry and emits nothing: the
warnings it has to give come back in `Decision.warnings`, and `opcore.ir.op.IrOp`, which
gathers the inputs (after loading the platform's kernels) and caches the result, emits
them with `warn_once`.

Merge rule (docs/design.md#priority-rule), for op ``o``, config ``c``, current platform ``p``:

1. the user list: ``o.set_priority([...])`` inside its block (the innermost one open in
   this thread or asyncio task), else ``c.kernel.ir_op_priority[o]`` (which includes
   ``OPCORE_IR_OP_PRIORITY``); a name that is not a registered provider is a
   ``ValueError`` listing the registered ones (`check_known`);
2. then ``p.get_default_ir_op_priority(c)[o]``, minus names already listed; a name that is
   not registered or not supported here is skipped and warned about once;
3. providers not supported here are dropped (a user-named one is warned about once);
4. the list is cut after the first provider that accepts every argument
   (``supports_args is None``); if there is none, ``native`` is appended, with a warning
   when the user's list was the reason.

Required properties (``c.kernel.required_properties``, docs/properties.md): providers that
do not declare every one are dropped before step 4, and ``native`` is appended only if it
declares them. No provider left is a `MissingPropertyError` naming the op and what each
provider lacks; a chain left without a provider that accepts every argument raises the
same error at the call no provider accepts. Nothing falls back to a provider without the
properties.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opcore.ir.op import Impl

logger = logging.getLogger("opcore.ir")

USER_SOURCE_CONFIG = "config.kernel.ir_op_priority / OPCORE_IR_OP_PRIORITY"
USER_SOURCE_BLOCK = "set_priority"


class MissingPropertyError(ValueError):
    """The config requires properties that no usable provider of an op declares."""


class PriorityWarning(UserWarning):
    """A priority entry could not be honoured (missing or unsupported provider, or native
    had to be appended)."""


_warned: set[tuple] = set()
_warn_lock = threading.Lock()


def warn_once(key: tuple, message: str) -> None:
    """Log and warn (`PriorityWarning`) ``message`` the first time ``key`` is seen in this
    process."""
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message)
    warnings.warn(message, PriorityWarning, stacklevel=4)


# --------------------------------------------------------------------------- decision
@dataclasses.dataclass
class Decision:
    """How an op's chain was built. ``names``/``chain``: the providers tried, in order.
    ``skipped``: provider -> reason, for registered providers not in the chain.
    ``warnings``: ``(key, message)`` pairs to give once each (see `warn_once`)."""

    op: str
    user: list[str]
    user_source: str
    platform_default: list[str]
    names: list[str]
    chain: tuple[Impl, ...]
    native_appended: bool
    skipped: dict[str, str]
    warnings: list[tuple[tuple, str]] = dataclasses.field(default_factory=list)
    # The properties every provider in the chain declares (the config's requirement), and
    # for each registered provider without them, the ones it lacks.
    required: list[str] = dataclasses.field(default_factory=list)
    lacking: dict[str, list[str]] = dataclasses.field(default_factory=dict)


def check_known(
    op_name: str,
    registered: Iterable[str],
    providers: Sequence[str],
    *,
    source: str,
    in_force: bool = False,
) -> None:
    """``ValueError`` when ``providers`` names one that is not in ``registered``.
    ``in_force``: the list was accepted earlier (a `set_priority` block being open), so an
    unknown name was unregistered since."""
    registered = list(registered)
    unknown = [p for p in providers if p not in registered]
    if not unknown:
        return
    names = ", ".join(repr(u) for u in unknown)
    listed = ", ".join(registered)
    if in_force:
        raise ValueError(
            f"op {op_name!r}: provider(s) {names} named by the open set_priority block "
            f"{list(providers)} were unregistered after the block began; registered "
            f"providers now: {listed}. Leave the block, or register the provider again"
        )
    raise ValueError(
        f"op {op_name!r}: {source} names unknown provider(s) {names}; registered "
        f"providers: {listed}"
    )


def decide(
    op_name: str,
    impls: Mapping[str, Impl],
    *,
    user: Sequence[str],
    user_source: str,
    platform_default: Sequence[str],
    platform_name: str,
    required: Sequence[str] = (),
) -> Decision:
    """The chain of op ``op_name`` with providers ``impls`` (which hold ``native``), for
    the ``user`` list (from ``user_source``: `USER_SOURCE_BLOCK` or `USER_SOURCE_CONFIG`)
    and the platform's ``platform_default`` list, keeping only providers that declare every
    property in ``required``. Raises ``ValueError`` when ``user`` names an unregistered
    provider (`check_known`), `MissingPropertyError` when no supported provider declares
    the ``required`` properties."""
    user = list(user)
    required = list(required)
    lacking = {
        name: impl.properties.missing(required)
        for name, impl in impls.items()
        if required and not impl.properties.has(required)
    }
    check_known(op_name, impls, user, source=user_source, in_force=user_source == USER_SOURCE_BLOCK)
    platform_list = list(platform_default)
    notes: list[tuple[tuple, str]] = []

    skipped: dict[str, str] = {}
    merged: list[str] = []
    for name in user:
        if name in merged:
            continue
        if not impls[name].supported:
            skipped[name] = "not supported here (supported=False)"
            notes.append(
                (
                    ("user-unsupported", op_name, name),
                    f"op {op_name!r}: priority ({user_source}) names provider {name!r}, which is "
                    f"not supported on this machine; it is skipped",
                )
            )
            continue
        merged.append(name)
    for name in platform_list:
        if name in merged or name in skipped:
            continue
        impl = impls.get(name)
        if impl is None:
            skipped[name] = f"named by platform {platform_name!r} default but not registered"
            notes.append(
                (
                    ("platform-missing", platform_name, op_name, name),
                    f"op {op_name!r}: platform {platform_name!r} default priority names provider "
                    f"{name!r}, which is not registered (registered: {', '.join(impls)}); "
                    "it is skipped",
                )
            )
            continue
        if not impl.supported:
            skipped[name] = "not supported here (supported=False)"
            notes.append(
                (
                    ("platform-unsupported", platform_name, op_name, name),
                    f"op {op_name!r}: platform {platform_name!r} default priority names provider "
                    f"{name!r}, which is not supported on this machine; it is skipped",
                )
            )
            continue
        merged.append(name)

    for name in [n for n in merged if n in lacking]:
        merged.remove(name)
        skipped[name] = _lacks(name, lacking[name])
    names: list[str] = []
    for name in merged:
        names.append(name)
        if impls[name].supports_args is None:
            break
    native_appended = False
    if "native" in lacking and (not names or impls[names[-1]].supports_args is not None):
        skipped["native"] = _lacks("native", lacking["native"])
        if not names:
            raise MissingPropertyError(missing_property_message(op_name, required, lacking))
    elif not names or impls[names[-1]].supports_args is not None:
        names.append("native")
        native_appended = True
        if user:
            notes.append(
                (
                    ("native-appended", op_name, tuple(user)),
                    f"op {op_name!r}: no provider in the priority {user} ({user_source}) "
                    "accepts all arguments; 'native' was appended as the last resort. Add "
                    "'native' (or a provider without supports_args) to the list to silence "
                    "this warning",
                )
            )
    for name in merged[len(names) :]:
        skipped.setdefault(name, f"after {names[-1]!r}, which accepts every argument")
    for name, impl in impls.items():
        if name not in names and name not in skipped:
            skipped[name] = (
                "not supported here (supported=False)"
                if not impl.supported
                else "not in the priority list"
            )
    return Decision(
        op=op_name,
        user=user,
        user_source=user_source,
        platform_default=platform_list,
        names=names,
        chain=tuple(impls[n] for n in names),
        native_appended=native_appended,
        skipped=skipped,
        warnings=notes,
        required=required,
        lacking=lacking,
    )


def _lacks(provider: str, missing: Sequence[str]) -> str:
    return f"lacks required propert{'y' if len(missing) == 1 else 'ies'} {', '.join(missing)}"


def missing_property_message(
    op_name: str,
    required: Sequence[str],
    lacking: Mapping[str, Sequence[str]],
    *,
    tried: Sequence[str] = (),
) -> str:
    """The `MissingPropertyError` text: the op, what is required and from where, the
    providers ``tried`` (declined by ``supports_args``) and what each other one lacks."""
    parts = [
        f"op {op_name!r}: the config requires {', '.join(required)} "
        f"(config.kernel.required_properties / {', '.join(required_variables(required))})"
    ]
    if tried:
        parts.append(
            f"the providers that declare it ({', '.join(tried)}) do not accept these arguments"
        )
    else:
        parts.append("no supported provider in its priority declares it")
    parts.append(
        "providers lacking it: "
        + "; ".join(f"{name} (lacks {', '.join(m)})" for name, m in lacking.items())
    )
    return "; ".join(parts) + (
        ". Register a provider with these properties (docs/properties.md) or do not require them"
    )


def required_variables(required: Sequence[str]) -> list[str]:
    """The environment switches that set ``required`` (for messages)."""
    return [f"OPCORE_{name.upper()}" for name in required] or ["-"]


def unknown_op_warnings(
    user_ops: Iterable[str], default_ops: Iterable[str], platform_name: str, known: Sequence[str]
) -> list[tuple[tuple, str]]:
    """``(key, message)`` for each op named by the user's priority (``user_ops``) or the
    platform's default (``default_ops``) that is not in ``known`` (a typo such as
    ``rms_nrom=triton`` would otherwise be ignored)."""
    notes = []
    for op_name in user_ops:
        if op_name not in known:
            notes.append(
                (
                    ("unknown-op", "user", op_name),
                    f"config.kernel.ir_op_priority / OPCORE_IR_OP_PRIORITY names op {op_name!r}, "
                    f"which is not registered (registered: {', '.join(known)}); "
                    "the entry is ignored",
                )
            )
    for op_name in default_ops:
        if op_name not in known:
            notes.append(
                (
                    ("unknown-op", platform_name, op_name),
                    f"platform {platform_name!r} default priority names op {op_name!r}, which is "
                    f"not registered (registered: {', '.join(known)}); the entry is ignored",
                )
            )
    return notes


# --------------------------------------------------------------------------- explain
@dataclasses.dataclass
class Explanation:
    """``selected``: the provider that runs (``None`` when explaining without arguments).
    ``providers``: every registered provider with a status (``selected``, ``tried``
    (supports_args returned False), ``not supported``, ``lacks property`` (the config
    requires one it does not declare), ``not in list``, ``not reached``, ``in list``) and
    the reason. ``required``: the properties the config requires. ``tuning``: what of the
    choice came from a tuning table (docs/tuning.md), or ``None``."""

    op: str
    selected: str | None
    priority: list[str]
    user: list[str]
    platform_default: list[str]
    native_appended: bool
    providers: list[dict[str, str]]
    required: list[str] = dataclasses.field(default_factory=list)
    tuning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        head = f"op {self.op}: priority {self.priority}"
        if self.selected is not None:
            head += f" -> {self.selected}"
        lines = [
            head,
            f"  user list: {self.user or '-'}; platform default: {self.platform_default or '-'}"
            + ("; native appended" if self.native_appended else "")
            + (f"; required: {', '.join(self.required)}" if self.required else ""),
        ]
        for p in self.providers:
            lines.append(f"  {p['provider']:<12} {p['status']:<14} {p['reason']}")
        if self.tuning:
            lines.append(f"  {self.tuning}")
        return "\n".join(lines)


def explain(decision: Decision, args: tuple, kwargs: Mapping[str, Any]) -> Explanation:
    """Which provider of ``decision``'s chain runs for these arguments (none given: the
    priority only), and why each other registered provider does not."""
    rows: dict[str, dict[str, str]] = {}
    selected = None
    if args or kwargs:
        for impl in decision.chain:
            if selected is not None:
                rows[impl.provider] = {
                    "status": "not reached",
                    "reason": f"{selected!r} comes first",
                }
                continue
            if impl.supports_args is None:
                selected = impl.provider
                rows[impl.provider] = {"status": "selected", "reason": "accepts every argument"}
                continue
            ok = impl.supports_args(*args, **kwargs)
            if ok is True:
                selected = impl.provider
                rows[impl.provider] = {
                    "status": "selected",
                    "reason": "supports_args returned True",
                }
            else:
                rows[impl.provider] = {
                    "status": "tried",
                    "reason": f"supports_args returned {ok!r}",
                }
    else:
        for impl in decision.chain:
            rows[impl.provider] = {
                "status": "in list",
                "reason": f"position {decision.names.index(impl.provider)}",
            }
    for name, reason in decision.skipped.items():
        if name in rows:
            continue
        status = (
            "not supported"
            if "not supported" in reason
            else "lacks property"
            if reason.startswith("lacks required")
            else "not in list"
        )
        rows[name] = {"status": status, "reason": reason}
    providers = [{"provider": name, **row} for name, row in rows.items()]
    return Explanation(
        op=decision.op,
        selected=selected,
        priority=list(decision.names),
        user=list(decision.user),
        platform_default=list(decision.platform_default),
        native_appended=decision.native_appended,
        providers=providers,
        required=list(decision.required),
    )
