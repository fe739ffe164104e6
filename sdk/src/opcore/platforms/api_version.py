"""What each plugin-API major version changed, and the reason a platform is refused.

`opcore.PLUGIN_API_VERSION` is the contract the core provides; a platform class declares
the range it was written for in ``Platform.plugin_api`` (min inclusive, max exclusive).
When a plugin falls outside the range, or still defines a member an API version removed
(`removed_member_note`), the resolver refuses it with the text built here: both versions,
what to install, and, for a plugin written for an older major version, what changed and
where the migration is described. The text is one line so `explain()`, `opcore info` and
the warning can show it whole.

This module imports nothing from torch or from the rest of the core except the version.
"""

from __future__ import annotations

from opcore import PLUGIN_API_VERSION

# Where the migration from each older major version is described.
MIGRATION_DOC = "docs/design.md#plugin-api-2-0"

# Older major version -> what the next major version removed and what replaces it.
MIGRATIONS: dict[int, str] = {
    1: (
        "API 2.0 removed the layers' forward_<vendor> methods and the platform member that "
        "chose among them (the 1.x forward chain): move kernels to opcore.ir providers "
        f"({MIGRATION_DOC}); and Platform.get_attn_backend_cls: register attention backends "
        "with register_backend in import_kernels"
    ),
}

# Platform members an API version removed -> the version and what replaces them. A class
# that still defines one was written for the older API whatever range it declares: the core
# would never call it, so the kernels behind it would silently stop running.
REMOVED_MEMBERS: dict[str, str] = {
    "get_attn_backend_cls": (
        "removed in plugin API 2.0 (the attention registry alone maps a backend name to its "
        "class): call opcore.attention.register_backend(name, path) in import_kernels and "
        f"list the name in get_attn_backend_candidates ({MIGRATION_DOC})"
    ),
}


# Plugin API 1.x let a platform choose which layer method ran: a member listing the layers'
# forward methods in the order to try. 2.0 gives a platform no say in layer methods and no
# member about them, so any public platform member whose name mentions "forward" is that
# chain (under its 1.x name or a variant) and is refused with this text.
FORWARD_CHAIN_REMOVED = (
    "removed in plugin API 2.0 (it is the 1.x forward chain: 2.0 platforms have no member "
    "about layer forward methods): layers run forward_native, whose ops dispatch by the "
    "platform's provider priority, or a register_oot replacement's forward_oot; delete the "
    f"member and move its kernels to opcore.ir providers ({MIGRATION_DOC})"
)


def removed_member_note(name: str) -> str | None:
    """What replaces platform member ``name`` if a plugin-API version removed it (a name in
    `REMOVED_MEMBERS`, or a public name mentioning ``forward``: the 1.x forward chain);
    ``None`` for a member the current API may have."""
    if name in REMOVED_MEMBERS:
        return REMOVED_MEMBERS[name]
    if not name.startswith("_") and "forward" in name:
        return FORWARD_CHAIN_REMOVED
    return None


def _major(version: str) -> int:
    return int(str(version).split(".")[0])


def migration_note(plugin_api: tuple[str, str]) -> str | None:
    """For a range written for an older major version than the core's, what changed since
    (``"written for plugin API 1.x; API 2.0 removed ..."``); otherwise ``None``."""
    low, high = plugin_api
    core = _major(PLUGIN_API_VERSION)
    # The newest major version the range covers: max is exclusive, so "1.0" to "2.0" is 1.x.
    minor = [int(part) for part in str(high).split(".")[1:]]
    newest = max(_major(high) - (0 if any(minor) else 1), _major(low))
    if newest >= core:
        return None
    notes = [MIGRATIONS[v] for v in range(newest, core) if v in MIGRATIONS]
    if not notes:
        return None
    return f"written for plugin API {newest}.x; " + "; ".join(notes)


def refusal_reason(class_path: str, plugin_api: tuple[str, str], distribution: str) -> str:
    """Why ``class_path`` (declaring ``plugin_api``, shipped by ``distribution``) is refused
    by this core: both versions, what to install, and the migration note when there is one."""
    low, high = plugin_api
    text = (
        f"{class_path} was written for opcore plugin API >={low},<{high}, but this opcore "
        f"provides plugin API {PLUGIN_API_VERSION}; install a version of {distribution} "
        f"built for plugin API {PLUGIN_API_VERSION}"
    )
    note = migration_note(plugin_api)
    return f"{text}; {note}" if note else text


def removed_members(cls: type) -> dict[str, str]:
    """The members of platform class ``cls`` (its own or inherited) that a plugin-API
    version removed, each with what replaces it; empty for a class of the current API."""
    notes = {name: removed_member_note(name) for name in dir(cls)}
    return {name: why for name, why in notes.items() if why is not None}


def removed_members_reason(class_path: str, cls: type) -> str | None:
    """Why ``cls`` is refused for defining removed members, or ``None`` when it defines none."""
    found = removed_members(cls)
    if not found:
        return None
    parts = [f"{name}, {why}" for name, why in found.items()]
    return f"{class_path} defines " + "; ".join(parts)
