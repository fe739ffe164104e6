#!/usr/bin/env bash
# One batched run on an H200 (device machine): TRITON_PAGED conformance on cuda over the
# full grid, a decode kernel-configuration sweep, and the decode benchmark.
# Run from the repository root; results go to $OUT (or ./bench-out).
set -euo pipefail
OUT=${OUT:-./bench-out}
mkdir -p "$OUT"
export PYTHONPATH=sdk/src${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
python3 bench/attention_decode.py --out "$OUT" "$@"
