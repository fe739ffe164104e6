"""Measured launch choices per shape: tuning tables, launch spaces, and `opcore tune`.

- A provider declares what can be tuned (`LaunchSpace`, `register_space`) and asks
  `launch_config` at each launch; it falls back to its own heuristic when the table in
  use has nothing for the size.
- Dispatch asks `router_for` (through `opcore.ir`) whether the table measured another
  provider order for a bucket.
- `opcore tune` (`opcore.tuner.search`) measures, gating every candidate against the
  float64 reference before timing it, and writes a table (`opcore.tuning.table`).

Details: docs/tuning.md.
"""

from __future__ import annotations

from opcore.tuning.buckets import bucket_tokens, register_bucket_key, token_bucket
from opcore.tuning.runtime import (
    ENV,
    GROUP,
    TuningWarning,
    environment,
    forced,
    identity,
    info,
    launch_config,
    reload,
    user_cache_dir,
)
from opcore.tuning.space import LaunchSpace, all_spaces, register_space, space_for
from opcore.tuning.table import FORMAT, VERSION, TuningTableError

__all__ = [
    "ENV",
    "FORMAT",
    "GROUP",
    "VERSION",
    "LaunchSpace",
    "TuningTableError",
    "TuningWarning",
    "all_spaces",
    "bucket_tokens",
    "environment",
    "forced",
    "identity",
    "info",
    "launch_config",
    "register_bucket_key",
    "register_space",
    "reload",
    "space_for",
    "token_bucket",
    "user_cache_dir",
]
