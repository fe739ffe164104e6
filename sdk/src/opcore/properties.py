"""Provider properties: what an engine may rely on beyond "close to the native function".

A provider declares them when it registers (``register_impl(..., properties=...)``); the
conformance suite checks each declared one on the device (docs/properties.md), and a
config can require them (``kernel.required_properties``, ``OPCORE_BATCH_INVARIANT``,
``OPCORE_DETERMINISTIC``), which restricts every op's priority to providers that have
them.

- ``batch_invariant``: each output row is bitwise the same whatever the other rows are and
  however many there are (a row computed alone equals that row inside any batch, at any
  position).
- ``deterministic``: the same inputs give bitwise the same outputs on every run.
- ``capture_safe``: after one warm-up call, a call can be captured by the platform's graph
  mechanism (``Platform.capture_graph``) and replayed with new values written into the
  captured input buffers, giving what an eager call on those values gives (no host
  synchronization, no host-side allocation or compilation while captured).

This module is a leaf (it imports nothing of opcore), so that `opcore.config`, a leaf
value below `opcore.ir`, can check the names a config requires. `opcore.ir`
re-exports `Properties` and `PROPERTY_NAMES`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

# The names, in the order reports show them.
PROPERTY_NAMES = ("batch_invariant", "deterministic", "capture_safe")


@dataclasses.dataclass(frozen=True)
class Properties:
    """The properties one provider declares (all ``False`` unless declared).

    Build it directly, or let `as_properties` convert the forms ``register_impl``
    accepts (a set or list of names, a ``{name: bool}`` mapping)."""

    batch_invariant: bool = False
    deterministic: bool = False
    capture_safe: bool = False

    def __post_init__(self) -> None:
        for name in PROPERTY_NAMES:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(
                    f"Properties.{name} must be a bool, got {type(value).__name__} {value!r}"
                )

    def names(self) -> frozenset[str]:
        """The names of the properties declared ``True``."""
        return frozenset(n for n in PROPERTY_NAMES if getattr(self, n))

    def has(self, required: Iterable[str]) -> bool:
        """Whether every name in ``required`` is declared."""
        return all(getattr(self, n) for n in required)

    def missing(self, required: Iterable[str]) -> list[str]:
        """The names in ``required`` that are not declared (in `PROPERTY_NAMES` order)."""
        wanted = set(required)
        return [n for n in PROPERTY_NAMES if n in wanted and not getattr(self, n)]

    def to_dict(self) -> dict[str, bool]:
        return {n: getattr(self, n) for n in PROPERTY_NAMES}

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.names(), key=PROPERTY_NAMES.index))

    def __str__(self) -> str:
        return ", ".join(self) or "-"


NONE = Properties()


def check_names(names: Iterable[object], *, where: str) -> list[str]:
    """``names`` as a list of known property names; a `ValueError` naming ``where``, the
    unknown name (with the closest known one) and the known ones otherwise."""
    out: list[str] = []
    for name in names:
        if not isinstance(name, str) or name not in PROPERTY_NAMES:
            close = difflib.get_close_matches(str(name), PROPERTY_NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"{where}: unknown property {name!r}{hint}; known properties: "
                f"{', '.join(PROPERTY_NAMES)}"
            )
        if name not in out:
            out.append(name)
    return out


def as_properties(value: Any, *, where: str) -> Properties:
    """Convert what ``register_impl(properties=...)`` accepts into `Properties`: ``None``
    (none declared), a `Properties`, an iterable of names, or a ``{name: bool}`` mapping.
    Anything else, or an unknown name, is an error naming ``where``."""
    if value is None:
        return NONE
    if isinstance(value, Properties):
        return value
    if isinstance(value, str):
        raise TypeError(
            f"{where}: properties must be a set of names, a {{name: bool}} mapping or a "
            f"Properties, got the string {value!r} (write {{{value!r}}})"
        )
    if isinstance(value, Mapping):
        check_names(value, where=where)
        for name, flag in value.items():
            if not isinstance(flag, bool):
                raise TypeError(
                    f"{where}: property {name!r} must be True or False, got "
                    f"{type(flag).__name__} {flag!r}"
                )
        return Properties(**dict(value))
    if isinstance(value, Iterable):
        return Properties(**dict.fromkeys(check_names(value, where=where), True))
    raise TypeError(
        f"{where}: properties must be a set of names, a {{name: bool}} mapping or a "
        f"Properties, got {type(value).__name__} {value!r}"
    )
