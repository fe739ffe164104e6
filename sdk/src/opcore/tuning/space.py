"""Launch-configuration spaces: what a provider lets `opcore tune` choose, per shape.

A provider that has launch parameters (tile sizes, warps, rows or heads per program, split
counts) declares a `LaunchSpace` for each op it serves with `register_space`. The tuner
asks the space for candidates at one shape; the provider's launcher asks
`opcore.tuning.launch_config` for the tuned configuration at each call and falls back to
its own heuristic (the space's ``default``) when the table has none.

A configuration is a flat ``{name: int}`` mapping over the space's ``params``. ``shape``
is the op's bucket shape (`opcore.tuning.buckets`): everything but the token count.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence

Config = Mapping[str, int]
Shape = tuple


@dataclasses.dataclass(frozen=True)
class LaunchSpace:
    """The launch parameters one provider exposes for one op.

    - ``params``: the configuration's keys.
    - ``default(tokens, shape)``: the provider's own heuristic choice (the incumbent).
    - ``candidates(tokens, shape)``: configurations worth timing, most promising first;
      the default need not be among them (the tuner always times it first).
    - ``check(config, shape)``: ``None`` when ``config`` is valid for every token count at
      ``shape``, else the reason (a table entry that fails it is ignored).
    - ``reduction_params``: parameters that change the order of a reduction; under a
      required ``batch_invariant`` property they are held fixed across token buckets.
    """

    params: tuple[str, ...]
    default: Callable[[int, Shape], Config]
    candidates: Callable[[int, Shape], Sequence[Config]]
    check: Callable[[Config, Shape], str | None]
    reduction_params: tuple[str, ...] = ()

    def validate(self, config: object, shape: Shape) -> str | None:
        """``None`` when ``config`` has exactly ``params`` as int keys and passes
        ``check``; else the reason."""
        if not isinstance(config, Mapping):
            return f"config must be a mapping, got {type(config).__name__}"
        keys = set(config)
        if keys != set(self.params):
            return f"config keys {sorted(keys)} are not the space's {sorted(self.params)}"
        for name, value in config.items():
            if not isinstance(value, int) or isinstance(value, bool):
                return f"config {name}={value!r} is not an int"
        return self.check(config, shape)


_SPACES: dict[tuple[str, str], LaunchSpace] = {}
_lock = threading.Lock()


def register_space(op: str, provider: str, space: LaunchSpace) -> None:
    """Declare ``provider``'s launch space for ``op`` (idempotent for the same object;
    a different space for a pair already declared is a `ValueError`)."""
    if not isinstance(space, LaunchSpace):
        raise TypeError(f"register_space({op!r}, {provider!r}): expected a LaunchSpace")
    with _lock:
        old = _SPACES.get((op, provider))
        if old is not None and old is not space:
            raise ValueError(f"op {op!r}, provider {provider!r}: a launch space is declared")
        _SPACES[(op, provider)] = space


def space_for(op: str, provider: str) -> LaunchSpace | None:
    """The space ``provider`` declared for ``op``, or ``None`` (nothing to tune but the
    provider order)."""
    return _SPACES.get((op, provider))


def all_spaces() -> dict[tuple[str, str], LaunchSpace]:
    """Every declared space by ``(op, provider)`` (a copy)."""
    return dict(_SPACES)
