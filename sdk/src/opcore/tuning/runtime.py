"""The tuning table in use: where it is found, what of it applies, and the O(1) lookups.

Search order (``OPCORE_TUNING``):

- ``off``: no table; every provider uses its own heuristic and the platform's order.
- a path: that file only (it must exist and parse: an error otherwise, never a silent
  fallback).
- unset: every ``*.json`` in the user cache dir (``$XDG_CACHE_HOME/opcore/tuning``, else
  ``~/.cache/opcore/tuning``), then the tables plugins ship: each entry point of the
  ``opcore.tuning_tables`` group names a package whose ``*.json`` resources are tables.
  Where two tables cover one op x dtype x bucket, the earlier one wins.

A table measured on another device (platform, device name or capability differ) does not
apply here and is skipped quietly (`info` lists it). A table for this device that does not
match this process is stale: the torch or Triton version differs, a provider's identity
hash changed, or a configuration fails its launch space's check. Stale parts are left out,
with one warning per load listing them all.

Every entry is validated when the tables load, once (types, lengths, values, the op's
bucket shape: `opcore.tuning.table.entry_problem`), never per call. In a table found by
the search an invalid entry, or a file that cannot be read or parsed, is left out and named
in that one warning; a table named by ``OPCORE_TUNING`` is used whole or not at all: any
invalid part of it is a `TuningTableError` from the load, and so from every op call.

Lookups: `launch_config` (a provider's launcher, per call) and the router `router_for`
builds for dispatch are a dict access and a list index, with the token bucket computed by
`opcore.tuning.buckets.token_bucket`. A token bucket nobody tuned takes the nearest tuned
one (`opcore.tuning.buckets.fill_buckets`); a shape nobody tuned borrows, per bucket, the
configuration of the nearest tuned shape where the provider's own heuristic chooses alike
(`opcore.tuning.lend.lend_row`), worked out at its first lookup and kept in the index, so
later lookups cost the same. The index
is rebuilt when the op registry changes (a provider registered or removed), when the
required properties change, or on `reload`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata as md
import importlib.resources
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from opcore.tuning import table as _table
from opcore.tuning.buckets import (
    MAX_BUCKET,
    fill_buckets,
    flat_key_function,
    key_function,
    keyed_by_first_arg,
    token_bucket,
)
from opcore.tuning.lend import lend_row
from opcore.tuning.space import space_for

logger = logging.getLogger("opcore.tuning")

ENV = "OPCORE_TUNING"
GROUP = "opcore.tuning_tables"
BATCH_INVARIANT = "batch_invariant"


class TuningWarning(UserWarning):
    """Part of a tuning table was left out (stale or invalid)."""


@dataclasses.dataclass
class State:
    """What the last load found (shown by `info`)."""

    mode: str = "unloaded"  # "off", "env", "search"
    searched: list[str] = dataclasses.field(default_factory=list)
    used: list[str] = dataclasses.field(default_factory=list)
    stale: list[str] = dataclasses.field(default_factory=list)
    elsewhere: list[str] = dataclasses.field(default_factory=list)  # other devices' tables
    # Parts a required property leaves out (a reduction config from a table not tuned for
    # batch invariance): current, not stale, so re-tuning would not bring them back and no
    # warning is given; `info` lists them.
    excluded: list[str] = dataclasses.field(default_factory=list)
    coverage: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    identity: str = "none"
    required: tuple[str, ...] = ()
    generation: int = -1


# (op, provider, dtype, shape) -> [config or None] * (MAX_BUCKET + 1); the tuned shapes'
# rows, and the rows lent to shapes looked up since the load (`_lend`)
_CONFIGS: dict[tuple, list | tuple] | None = None
# (op, provider, dtype) -> {tuned shape: {tuned bucket: config}}: the lenders
_TUNED: dict[tuple, dict[tuple, dict[int, Any]]] = {}
# (op, provider, dtype, shape) -> [the tuned shape lending each bucket, or None] for the
# rows `_lend` put into the index (for explain, and to drop them when they grow too many)
_LENT: dict[tuple, list] = {}
# Most shapes given a lent row between loads before those rows are dropped and redone.
MAX_LENT = 1024
# The row of a shape nothing lends to: empty, so that `launch_config` answers None without
# reading the token count (a traced one would be specialised to its hint).
_NO_ROW: tuple = ()
# op -> {(dtype, shape): [provider order tuple or None] * (MAX_BUCKET + 1)}
_ORDERS: dict[str, dict[tuple, list]] = {}
# (op, dtype, shape, bucket) -> (table source, tuned tokens): for explain
_ORIGIN: dict[tuple, tuple[str, int]] = {}
# (op, provider) -> config the tuner is timing (see `forced`)
_FORCED: dict[tuple[str, str], Mapping[str, int]] = {}
_STATE = State()
_lock = threading.RLock()


# --------------------------------------------------------------------------- sources
@dataclasses.dataclass(frozen=True)
class Sources:
    """What the index reads from the layers above it, handed over by `opcore.ir.dispatch`
    when it is imported (`connect`), so that this module imports nothing of ir, config or
    platforms: ``ops()`` the registered single-process ops by name (kernels loaded; each
    with ``.impls``, provider -> Impl), ``environment()`` this process's table key (see
    `environment`), ``required_properties()`` the current config's, ``generation()`` the
    registry generation, ``invalidate()`` moves it (every dispatch route is made anew)."""

    ops: Callable[[], Mapping[str, Any]]
    environment: Callable[[], dict[str, Any]]
    required_properties: Callable[[], tuple[str, ...]]
    generation: Callable[[], int]
    invalidate: Callable[[], None]


_SOURCES: Sources | None = None


def connect(sources: Sources) -> None:
    """Hand the index what it reads (`opcore.ir.dispatch` does, once, at import)."""
    global _SOURCES
    _SOURCES = sources


def _sources() -> Sources:
    if _SOURCES is None:
        raise RuntimeError(
            "opcore.tuning.runtime has no sources: import opcore.ir before using the index"
        )
    return _SOURCES


def environment() -> dict[str, Any]:
    """This process's table key: the current platform's name, its device 0's name and
    capability, the torch and Triton versions (``None`` where there is none)."""
    return _sources().environment()


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/opcore/tuning``, else ``~/.cache/opcore/tuning``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opcore" / "tuning"


def setting() -> str:
    """``OPCORE_TUNING`` as given: ``"off"``, a path, or ``""`` (search)."""
    return os.environ.get(ENV, "").strip()


def _candidates() -> tuple[str, list[tuple[str, Callable[[], _table.Table]]]]:
    """The mode and the tables to try, in order, each as (label, loader)."""
    value = setting()
    if value.lower() == "off":
        return "off", []
    if value:
        path = Path(value)
        if not path.is_file():
            what = (
                "is a directory, not a table file"
                if path.is_dir()
                else "no such file"
                if not path.exists()
                else "not a regular file"
            )
            raise _table.TuningTableError(
                f"{ENV}={value!r}: {what}; give a tuning table written by "
                f"`opcore tune --out`, or 'off'"
            )
        label = f"{ENV}={value}"
        # Named explicitly: any invalid part of it is an error (TuningTableError), never
        # left out in silence.
        return "env", [(label, lambda: _table.load(path, source=label))]
    found: list[tuple[str, Callable[[], _table.Table]]] = []
    cache = user_cache_dir()
    try:
        cached = sorted(cache.glob("*.json")) if cache.is_dir() else []
    except OSError as exc:
        warnings.warn(
            f"opcore tuning: the user cache dir {cache} cannot be read: {exc}",
            TuningWarning,
            stacklevel=2,
        )
        cached = []
    for p in cached:
        found.append((str(p), functools.partial(_table.load, p, skip_invalid_entries=True)))
    for ep in sorted(md.entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
        try:
            root = importlib.resources.files(ep.value)
            names = sorted(r.name for r in root.iterdir() if r.name.endswith(".json"))
        except Exception as exc:
            warnings.warn(
                f"{GROUP} entry point {ep.name!r} ({ep.value}) cannot be read: {exc}",
                TuningWarning,
                stacklevel=2,
            )
            continue
        for n in names:
            label = f"{ep.value}/{n} ({GROUP}: {ep.name})"
            found.append(
                (
                    label,
                    functools.partial(_load_resource, root.joinpath(n), label),
                )
            )
    return "search", found


def _load_resource(resource: Any, label: str) -> _table.Table:
    try:
        if not resource.is_file():  # a directory named *.json; a FIFO would block the read
            raise OSError("a directory" if resource.is_dir() else "not a regular file")
        text = resource.read_bytes()  # an unreadable file: OSError
    except OSError as exc:
        raise _table.TuningTableError(f"tuning table {label}: cannot be read ({exc})") from None
    return _table.loads(text, source=label, skip_invalid_entries=True)


# --------------------------------------------------------------------------- loading
def _required_properties() -> tuple[str, ...]:
    return tuple(sorted(_sources().required_properties()))


def _registry_generation() -> int:
    return int(_sources().generation())


def _load(required: tuple[str, ...]) -> None:
    """Rebuild the index from the tables found (callers hold ``_lock``). Every entry is
    checked here, once: `table.parse` (types, lengths, values, the op's bucket shape),
    then what only this process can tell (the dtype, the launch space's check); a lookup
    never meets a malformed entry. When the load fails (a table named by ``OPCORE_TUNING``
    that is missing or invalid), the previous index is dropped and the routes built from
    it invalidated, so every later call meets the error, as in a new process."""
    global _CONFIGS, _ORDERS, _ORIGIN, _TUNED, _LENT
    try:
        _build(required)
    except BaseException:
        loaded_before = _STATE.mode not in ("unloaded", "failed")
        _CONFIGS, _ORDERS, _ORIGIN, _TUNED, _LENT = None, {}, {}, {}, {}
        _set_state(State(mode="failed", required=required))
        if loaded_before:
            _bump_generation()
        raise


def _bump_generation() -> None:
    _sources().invalidate()


def _build(required: tuple[str, ...]) -> None:
    global _CONFIGS, _ORDERS, _ORIGIN, _TUNED, _LENT
    ops = _sources().ops()  # loads the platform's kernels first
    state = State(required=required, generation=_registry_generation())
    configs: dict[tuple, list | tuple] = {}
    orders: dict[str, dict[tuple, list]] = {}
    origin: dict[tuple, tuple[str, int]] = {}
    mode, candidates = _candidates()
    state.mode = mode
    here = environment() if candidates else {}
    # tuned points per index key, for the nearest-bucket fill: key -> {bucket: value}
    tuned_cfg: dict[tuple, dict[int, Any]] = {}
    tuned_ord: dict[tuple, dict[int, Any]] = {}
    digests: list[str] = []
    for label, loader in candidates:
        state.searched.append(label)
        try:
            table = loader()
        except _table.TuningTableError as exc:
            if mode == "env":
                raise
            state.stale.append(str(exc))
            continue
        diff = [
            f"{k}: table {table.environment.get(k)!r}, here {here.get(k)!r}"
            for k in _table.ENVIRONMENT_KEYS
            if table.environment.get(k) != here.get(k)
        ]
        if mode != "env" and any(
            table.environment.get(k) != here.get(k) for k in _table.DEVICE_KEYS
        ):
            # A table found for another device is not stale, just not this machine's: no
            # warning (one named by OPCORE_TUNING is, below).
            state.elsewhere.append(f"{label}: {'; '.join(diff)}")
            continue
        if diff:
            state.stale.append(f"{label}: environment differs ({'; '.join(diff)})")
            continue
        # Entries `table.parse` left out (searched tables only: a named one raised there).
        state.stale += [f"{label}: {what} (entry left out)" for what in table.invalid]
        # What only this process can tell is invalid (a dtype, a shape a launch space's
        # check cannot read): (what, the part left out for it)
        invalid: list[tuple[str, str]] = []
        invariant_ok = BATCH_INVARIANT not in required or BATCH_INVARIANT in table.properties
        used = 0
        for e in table.entries:
            op = ops.get(e.op)
            if op is None:
                state.stale.append(f"{label}: op {e.op!r} is not registered")
                continue
            dtype = getattr(torch, e.dtype, None)
            if not isinstance(dtype, torch.dtype):
                invalid.append((f"{_where(e)}.dtype {e.dtype!r} is not a torch dtype", "entry"))
                continue
            b = token_bucket(e.tokens)
            ids = table.providers.get(e.op, {})
            fresh = []
            for prov in e.order:
                impl = op.impls.get(prov)
                if impl is None or ids.get(prov) != impl.identity_hash():
                    gone = "not registered" if impl is None else "identity changed"
                    state.stale.append(f"{label}: {e.op}/{prov} ({gone})")
                    continue
                fresh.append(prov)
            # The order is used whole or not at all: without a stale provider the rest
            # would put its successor first, an order nobody measured.
            if fresh and len(fresh) == len(e.order):
                tuned_ord.setdefault((e.op, dtype, e.shape), {}).setdefault(b, tuple(fresh))
            for prov, cfg in e.configs.items():
                impl = op.impls.get(prov)
                if impl is None or ids.get(prov) != impl.identity_hash():
                    continue  # reported with the order above
                space = space_for(e.op, prov)
                try:
                    why: str | None = (
                        "no launch space declared"
                        if space is None
                        else space.validate(cfg, e.shape)
                    )
                except Exception as exc:  # a shape the space's check cannot read
                    invalid.append(
                        (
                            f"{_where(e)}.configs[{prov!r}] at shape {list(e.shape)}: the "
                            f"launch space's check raised {type(exc).__name__}: {exc}",
                            "configuration",
                        )
                    )
                    continue
                if why is not None:
                    state.stale.append(f"{label}: {e.op}/{prov} config {dict(cfg)}: {why}")
                    continue
                assert space is not None
                if space.reduction_params and not invariant_ok:
                    state.excluded.append(
                        f"{label}: {e.op}/{prov} (batch_invariant is required; the table "
                        f"was not tuned for it)"
                    )
                    continue
                key = (e.op, prov, dtype, e.shape)
                if b not in tuned_cfg.setdefault(key, {}):
                    tuned_cfg[key][b] = dict(cfg)
                    used += 1
            origin.setdefault((e.op, dtype, e.shape, b), (label, e.tokens))
        if invalid and mode == "env":
            more = f"; and {len(invalid) - 1} more invalid part(s)" if len(invalid) > 1 else ""
            raise _table.TuningTableError(f"tuning table {label}: {invalid[0][0]}{more}")
        state.stale += [f"{label}: {what} ({part} left out)" for what, part in invalid]
        if used or any(e.order for e in table.entries):
            state.used.append(label)
            digests.append(table.digest)
    tuned_shapes: dict[tuple, dict[tuple, dict[int, Any]]] = {}
    for key, points in tuned_cfg.items():
        configs[key] = fill_buckets(points)
        tuned_shapes.setdefault(key[:3], {})[key[3]] = dict(points)
    for (op_name, dtype, shape), points in tuned_ord.items():
        orders.setdefault(op_name, {})[(dtype, shape)] = fill_buckets(points)
    for op_name, dtype, shape, _b in origin:
        cov = state.coverage.setdefault(op_name, {"shapes": set(), "buckets": 0, "dtypes": set()})
        cov["shapes"].add(shape)
        cov["dtypes"].add(str(dtype).removeprefix("torch."))
        cov["buckets"] += 1
    material = "|".join([mode, *digests, ",".join(required)])
    state.identity = hashlib.sha256(material.encode()).hexdigest()[:16] if digests else mode
    changed = state.identity != _STATE.identity
    _CONFIGS, _ORDERS, _ORIGIN, _TUNED, _LENT = configs, orders, origin, tuned_shapes, {}
    _set_state(state)
    if state.stale:
        shown = "; ".join(state.stale[:6]) + (
            f"; and {len(state.stale) - 6} more" if len(state.stale) > 6 else ""
        )
        msg = (
            f"opcore tuning: {len(state.stale)} stale or invalid table part(s) ignored "
            f"(re-run `opcore tune`; `opcore info` lists the tables): {shown}"
        )
        logger.warning(msg)
        warnings.warn(msg, TuningWarning, stacklevel=3)
    if changed:
        _bump_generation()
        _STATE.generation = _registry_generation()


def _where(entry: _table.Entry) -> str:
    """``entries[i] (op dtype T=tokens)``: an entry as the table's reader finds it."""
    return f"entries[{entry.index}] ({entry.op} {entry.dtype} T={entry.tokens})"


def _set_state(state: State) -> None:
    global _STATE
    _STATE = state


def _lend(op: str, provider: str, dtype: torch.dtype, shape: tuple) -> list | tuple:
    """The row of a shape the tables have no entry for (`lend_row`), put into the index so
    that its next lookup is a dictionary hit (a shape nothing lends to gets the empty
    `_NO_ROW`). Cold: once per shape per load. Under a required ``batch_invariant`` a space
    whose parameters order a reduction lends nothing: lenders may differ between buckets,
    and so the reduction order with the batch size."""
    with _lock:
        index = _ensure()
        key = (op, provider, dtype, shape)
        found = index.get(key)
        if found is not None:
            return found
        tuned = _TUNED.get((op, provider, dtype))
        space = space_for(op, provider)
        row: list | tuple = _NO_ROW
        lent_by: list | None = None
        if (
            tuned
            and space is not None
            and not (space.reduction_params and BATCH_INVARIANT in _STATE.required)
        ):
            got, by = lend_row(space, shape, tuned)
            if any(c is not None for c in got):
                row, lent_by = got, by
        if len(_LENT) >= MAX_LENT:  # bounded: a run of ever new shapes
            for k in _LENT:
                index.pop(k, None)
            _LENT.clear()
        index[key] = row
        _LENT[key] = lent_by or []
        return row


def _ensure() -> dict[tuple, list | tuple]:
    with _lock:
        if _CONFIGS is None:
            _load(_required_properties())
        assert _CONFIGS is not None
        return _CONFIGS


def reload(required_properties: tuple[str, ...] | None = None) -> State:
    """Forget the index and load the tables again (after writing one, or changing
    ``OPCORE_TUNING``); returns the new `State`. ``required_properties``: load as if the
    config required these (default: the current config's)."""
    global _CONFIGS
    with _lock:
        _CONFIGS = None
        if required_properties is not None:
            _load(tuple(sorted(required_properties)))
        _ensure()
        return _STATE


def sync() -> None:
    """Reload when the op registry or the required properties changed since the last
    load (dispatch calls this when it rebuilds an op's cache: a cold path)."""
    with _lock:
        required = _required_properties()
        if (
            _CONFIGS is None
            or required != _STATE.required
            or _STATE.generation != _registry_generation()
        ):
            _load(required)


# --------------------------------------------------------------------------- lookups
def launch_config(
    op: str, provider: str, dtype: torch.dtype, tokens: int, shape: tuple
) -> Mapping[str, int] | None:
    """The tuned launch configuration of ``provider`` for ``op`` at this size, or ``None``
    (use the provider's heuristic): the table's at a tuned shape, the nearest tuned token
    bucket's at another token count, and at a shape no entry has, the one `lend_row`
    lends. Called by launchers on every call: two dict lookups and a list index (a shape's
    first lookup works out its lent row)."""
    if _FORCED:
        forced_cfg = _FORCED.get((op, provider))
        if forced_cfg is not None:
            return forced_cfg
    index = _CONFIGS
    if index is None:
        index = _ensure()
    row = index.get((op, provider, dtype, shape))
    if row is None:
        row = _lend(op, provider, dtype, shape)
    if not row:
        return None
    return row[token_bucket(int(tokens))]


@contextlib.contextmanager
def forced(op: str, provider: str, config: Mapping[str, int]) -> Iterator[None]:
    """Within the block, `launch_config` answers ``config`` for ``(op, provider)`` at
    every size (the tuner's way to time one candidate through the real launcher). Entering
    and leaving invalidate the dispatch routes: a launch bound before the block holds the
    configuration of its time."""
    with _lock:
        _FORCED[(op, provider)] = dict(config)
    _bump_generation()
    try:
        yield
    finally:
        with _lock:
            _FORCED.pop((op, provider), None)
        _bump_generation()


# Most (shape, dtype) pairs a router memoizes before it starts over.
MEMO_SIZE = 1024


def router_for(op: str, decision: Any, impls: Mapping[str, Any]) -> Callable[[tuple], Any] | None:
    """For dispatch: a function ``args -> Impl | None`` choosing, per bucket, the first
    provider of the table's measured order that the priority rule allows and that accepts
    the arguments, when that differs from the chain's first; ``None`` when the table never
    reorders this op here.

    Allowed: the providers of ``decision``'s chain, and those the rule listed but cut
    after a provider that accepts every argument (still supported and with the required
    properties: the rule dropped those for other reasons). A user priority list
    (``decision.user``) is never reordered: the user disposes."""
    sync()
    if decision.user:
        return None
    rows = _ORDERS.get(op)
    keyfn = key_function(op)
    if not rows or keyfn is None:
        return None
    allowed = {impl.provider: impl for impl in decision.chain}
    for name, reason in decision.skipped.items():
        # priority.decide's reason for a listed provider cut after one taking everything
        if reason.startswith("after ") and name in impls:
            allowed[name] = impls[name]
    fast = flat_key_function(op)
    assert fast is not None  # an op with a key function has its flat form
    first = decision.chain[0].provider
    # (dtype, *shape) -> the Impl to route to per token bucket (None: the chain's first),
    # all decided here, so a call is a key, one dictionary lookup and one list index.
    table: dict[tuple, list] = {}
    for (dtype, shape), orders in rows.items():
        row = []
        for order in orders:
            pick = next((allowed[p] for p in order if p in allowed), None)
            row.append(None if pick is None or pick.provider == first else pick)
        if any(r is not None for r in row):
            table[(dtype,) + tuple(shape)] = row
    if not table:
        return None
    get = table.get

    def lookup(args: tuple) -> Any:
        """The bucket's Impl (None: the chain's first), before ``supports_args``."""
        try:
            key, t = fast(args)
            row = get(key)
            if row is None:
                return None
            return row[token_bucket(t)]
        except (TypeError, AttributeError):
            # symbolic sizes (tracing): the key function reads their hints
            dtype, t, shape = keyfn(*args)
            row = get((dtype,) + tuple(shape))
            if row is None:
                return None
            return row[token_bucket(t)]

    if not keyed_by_first_arg(op):

        def route(args: tuple) -> Any:
            impl = lookup(args)
            if impl is None:
                return None
            sa = impl.supports_args
            return impl if sa is None or sa(*args) is True else None

        return route

    # The key is the first argument's shape and dtype: the lookup's answer is memoized per
    # (shape, dtype), a call then costs one dictionary access instead of the key's work.
    memo: dict[tuple, Any] = {}

    def route_memo(args: tuple) -> Any:
        try:
            x = args[0]
            k = (x.shape, x.dtype)
            impl = memo[k]
        except KeyError:
            impl = lookup(args)
            if len(memo) >= MEMO_SIZE:  # bounded: a run of ever new shapes
                memo.clear()
            memo[k] = impl
        except (TypeError, AttributeError, IndexError):  # symbolic sizes are not hashed
            impl = lookup(args)
        if impl is None:
            return None
        sa = impl.supports_args
        return impl if sa is None or sa(*args) is True else None

    return route_memo


def explain_note(op: str, provider: str | None, args: tuple) -> str | None:
    """One line saying what of ``provider``'s choice for ``args`` came from a table
    (its order, its launch configuration), or ``None`` when nothing did."""
    keyfn = key_function(op)
    if provider is None or keyfn is None or not args:
        return None
    try:
        dtype, tokens, shape = keyfn(*args)
    except Exception:
        return None
    _ensure()
    b = token_bucket(int(tokens))
    origin = _ORIGIN.get((op, dtype, shape, b))
    parts = []
    rows = _ORDERS.get(op, {}).get((dtype, shape))
    if rows is not None:
        parts.append(f"provider order {list(rows[min(b, MAX_BUCKET)])}")
    cfg = launch_config(op, provider, dtype, int(tokens), shape)
    if cfg is not None:
        parts.append(f"{provider!r} launch config {dict(cfg)}")
    if not parts:
        return None
    lent_by = _LENT.get((op, provider, dtype, shape)) or []
    if origin is not None:
        where = f"tuned at {origin[1]} tokens in {origin[0]}"
    elif cfg is not None and b < len(lent_by) and lent_by[b] is not None:
        where = (
            f"lent by the tuned shape {lent_by[b]}, where the provider's heuristic chooses as here"
        )
    else:
        where = "nearest tuned token bucket in the table in use"
    return f"from tuning: {', '.join(parts)} ({where}; shape {shape})"


def identity() -> str:
    """A short hash of the tables in use and the required properties (``"off"`` /
    ``"search"`` / ``"env"`` when none applies): part of the compile cache key."""
    _ensure()
    return _STATE.identity


def info() -> dict[str, Any]:
    """The table(s) in use and their coverage, for `opcore info`. Reads the index, so
    `opcore.ir` must have been imported (it connects the index; `opcore info` does);
    else a `RuntimeError` says so."""
    _ensure()
    s = _STATE
    return {
        "setting": setting() or "(unset: user cache dir, then plugin tables)",
        "mode": s.mode,
        "user_cache_dir": str(user_cache_dir()),
        "searched": list(s.searched),
        "used": list(s.used),
        "stale": list(s.stale),
        "other_devices": list(s.elsewhere),
        "excluded_by_required_properties": list(s.excluded),
        "identity": s.identity,
        "required_properties": list(s.required),
        "coverage": {
            op: {
                "shapes": sorted(str(list(x)) for x in c["shapes"]),
                "dtypes": sorted(c["dtypes"]),
                "buckets": c["buckets"],
            }
            for op, c in sorted(s.coverage.items())
        },
    }
