"""Real, minimal installed distributions for plugin tests.

`make_distribution` writes a package's modules and a ``.dist-info`` folder (``METADATA``,
``entry_points.txt``, ``RECORD``) into a site directory, exactly what pip leaves behind, so
``importlib.metadata`` discovers the entry points the ordinary way: no monkeypatched loader.
Put the directory on ``PYTHONPATH`` of a fresh interpreter (`run_python`) so each test sees
a clean, once-per-process resolution.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path


def make_distribution(
    site: str | os.PathLike[str],
    name: str,
    *,
    version: str = "0.1.0",
    entry_points: Mapping[str, Mapping[str, str]] | None = None,
    files: Mapping[str, str] | None = None,
) -> Path:
    """Install distribution ``name`` into ``site``.

    ``entry_points``: ``{group: {entry_name: "module:attr"}}``.
    ``files``: ``{relative path: source}``; sources are dedented.
    Returns the ``.dist-info`` path.
    """
    site = Path(site)
    site.mkdir(parents=True, exist_ok=True)
    written = []
    for rel, source in (files or {}).items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip("\n"), encoding="utf-8")
        written.append(rel)
    normalized = name.replace("-", "_")
    info = site / f"{normalized}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )
    lines = []
    for group, eps in (entry_points or {}).items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in eps.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines), encoding="utf-8")
    record = [f"{rel},," for rel in written]
    record += [f"{info.name}/{f},," for f in ("METADATA", "entry_points.txt", "RECORD")]
    (info / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8")
    return info


def run_python(
    code: str,
    *,
    site: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    args: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with ``site`` first on ``PYTHONPATH``.

    ``OPCORE_*`` variables of this process are dropped unless ``env`` sets them, so a test
    controls resolution entirely.
    """
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPCORE_")}
    if site is not None:
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    full_env.update(env or {})
    command = [sys.executable, "-c", textwrap.dedent(code)] if code else [sys.executable]
    return subprocess.run(
        command + list(args or []),
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
