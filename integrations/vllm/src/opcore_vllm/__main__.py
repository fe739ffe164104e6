"""``python -m opcore_vllm ir-op-priority``: print vLLM's ``--ir-op-priority`` value (JSON)
from ``OPCORE_VLLM_PRIORITY``; ``python -m opcore_vllm report``: what the bridge registers."""

from __future__ import annotations

import json
import sys

import opcore_vllm


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["ir-op-priority"]:
        print(json.dumps(opcore_vllm.ir_op_priority()))
        return 0
    if args == ["report"]:
        print(json.dumps(opcore_vllm.register().to_dict(), indent=2))
        return 0
    print("usage: python -m opcore_vllm {ir-op-priority|report}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
