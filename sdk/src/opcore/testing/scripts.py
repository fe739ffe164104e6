"""Import a script that is not part of a package (the repository's ``bench/*.py``) as a
module, so a test can call its functions in-process."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: str | Path) -> ModuleType:
    """The module of the Python file at ``path``, executed once per call under a name of
    its own (``<stem>_script``): its top level runs, nothing is added to ``sys.modules``."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"{path.stem}_script", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"load_script: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
