"""Print the path of the cuda plugin's shipped tuning table for this machine's GPU: the
table whose ``environment.device`` is the GPU's name. With a GPU that no table names it
prints nothing, says so on stderr and exits 1 (a table for another device would only be
ignored as stale, and a run "with the table" would time the launch model unannounced);
without a GPU (the CPU dry runs) it prints the H200 table's path. bench/gpu/tune.sh and
wide_grid.sh take it unless TUNE_TABLE names another."""

from __future__ import annotations

import json
import sys
from pathlib import Path

TABLES = Path(__file__).resolve().parents[2] / "plugins/cuda/src/opcore_plugin_cuda/tuning"
ROOT = TABLES.parents[4]
DRY_RUN_TABLE = TABLES / "nvidia-h200-torch2.11-triton3.6.json"


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(DRY_RUN_TABLE.relative_to(ROOT))
        return 0
    name = torch.cuda.get_device_name()
    for path in sorted(TABLES.glob("*.json")):
        if json.loads(path.read_text())["environment"].get("device") == name:
            print(path.relative_to(ROOT))
            return 0
    print(f"shipped_table: no table in {TABLES.relative_to(ROOT)} names {name!r}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
