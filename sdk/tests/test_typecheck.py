"""The core and the conformance suite type-check clean under mypy (config: [tool.mypy] in
the root pyproject.toml), so the annotations their py.typed markers publish hold.

CI cost: one mypy run, about 30 s cold on this 2-core machine (about 95 s while other
work shares the cores; CI starts without a mypy cache), a few seconds with a warm
``.mypy_cache``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300  # a cold run on 2 busy cores needs about a third of this


def test_mypy_is_clean_on_the_core_and_the_conformance_suite() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "sdk/src/opcore", "conformance/src/opcore_conformance"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"mypy (see requirements.txt) failed:\n{proc.stdout}{proc.stderr}"
