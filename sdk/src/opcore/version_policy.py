"""The version policy: how opcore's version relates to the plugin API it implements.

opcore's major version *is* the plugin API's major version (`opcore.PLUGIN_API_VERSION`):

- a change that can break a platform plugin (a removed or changed `Platform` member, hook,
  entry-point group or registration rule) raises both majors together;
- a minor release only adds to the API, so a plugin written against X.Y works with every
  opcore X.Z where Z >= Y;
- a patch release changes no API.

A plugin therefore declares ``opcore>=X.Y,<X+1`` (`requirement`) where X.Y is the oldest
opcore whose API it uses, and its platform class ``plugin_api = ("X.Y", "X+1.0")``: pip
enforces the first when installing; the core checks the second at run time for what
packaging cannot see (a plugin loaded from a path, an editable install, a forced install).
"""

from __future__ import annotations

__all__ = ["major_minor", "requirement"]


def major_minor(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a release version such as ``2.0.0`` or ``2.1``; ValueError
    naming the version when it does not start with two integers."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"version {version!r} does not start with MAJOR.MINOR") from None


def requirement(version: str | None = None, name: str = "opcore") -> str:
    """The requirement a plugin built against opcore ``version`` (default: this one)
    declares: ``opcore>=X.Y,<X+1``. ``name`` gives the same range for a distribution
    released with opcore (``opcore-conformance``)."""
    if version is None:
        from opcore import __version__

        version = __version__
    major, minor = major_minor(version)
    return f"{name}>={major}.{minor},<{major + 1}"
