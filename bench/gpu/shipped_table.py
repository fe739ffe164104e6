"""Print the path of the cuda plugin's shipped tuning table for this machine's GPU (the
table whose ``environment.device`` is the device's name), or of the H200 table where no
table names this GPU or there is none (the CPU dry runs). bench/gpu/tune.sh and
wide_grid.sh take it unless TUNE_TABLE names another."""

from __future__ import annotations

import json
import sys
from pathlib import Path

TABLES = Path(__file__).resolve().parents[2] / "plugins/cuda/src/opcore_plugin_cuda/tuning"
DEFAULT = TABLES / "nvidia-h200-torch2.11-triton3.6.json"


def main() -> int:
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    for path in sorted(TABLES.glob("*.json")):
        if json.loads(path.read_text())["environment"].get("device") == name:
            print(path.relative_to(TABLES.parents[4]))
            return 0
    print(DEFAULT.relative_to(TABLES.parents[4]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
