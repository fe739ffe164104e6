"""The transformers versions this integration was written and tested against.

The replacement forwards reproduce the attention and decoder-layer code of those versions
(argument names, the KV-cache call), so a version outside the range is refused rather than
run on a guess.
"""

from __future__ import annotations

import re

# Keep in step with the `transformers` extra in sdk/pyproject.toml.
MIN_VERSION = (5, 17)
MAX_VERSION_EXCLUSIVE = (5, 25)
TESTED_RANGE = ">=5.17,<5.25"


def parse(version: str) -> tuple[int, int]:
    """``"5.24.0"`` -> ``(5, 24)``; ``"5.25.0.dev0"`` -> ``(5, 25)``."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"cannot read a transformers version from {version!r}")
    return int(m.group(1)), int(m.group(2))


def check(version: str) -> str | None:
    """``None`` when ``version`` is in the tested range, else the reason it is refused."""
    v = parse(version)
    if MIN_VERSION <= v < MAX_VERSION_EXCLUSIVE:
        return None
    return (
        f"transformers {version} is outside the range this integration was tested with "
        f"({TESTED_RANGE}); install 'opcore[transformers]' or pass check_version=False to try it"
    )
