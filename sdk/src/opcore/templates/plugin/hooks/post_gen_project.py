"""Tidy the generated project (the working directory).

Installing opcore byte-compiles the template's Python files in place, so an installed
template may hold ``__pycache__`` folders; they must not reach the vendor's project. The CI
script must be executable whatever the installer did to file modes.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path


def main() -> None:
    root = Path.cwd()
    for cache in sorted(root.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)
    for compiled in root.rglob("*.py[co]"):
        compiled.unlink()
    script = root / ".ci" / "run"
    mode = os.stat(script).st_mode
    os.chmod(script, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


if __name__ == "__main__":
    main()
