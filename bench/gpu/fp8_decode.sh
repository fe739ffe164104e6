#!/usr/bin/env bash
# FP8 decode step compiled three ways (plain torch.compile, opcore lowering, opcore + fusion
# passes) on the GPU: bench/fp8_decode_step.py, 4 layers of Llama-3-8B shapes, batches
# 1, 8, 32, 128, CUDA graphs on. Total runtime: about 2 minutes (6 compiles of ~10-15 s,
# timing ~10 s), capped at FP8_TIMEOUT (default 210 s); results are written after every
# variant, so a run cut short keeps what it measured.
#
# Run from the repo root after bench/h200_run.sh's install lines (PYTHONPATH=/tmp/site):
#   OUT=/tmp/out bash bench/gpu/fp8_decode.sh
# Dry run on the CPU (plumbing only: tiny shapes, no CUDA graphs):
#   DRY=1 OUT=/tmp/out bash bench/gpu/fp8_decode.sh
# Results: $OUT/fp8_decode/fp8_decode_step.{json,md}, log.txt.
set -u
OUT=${OUT:-/tmp/opcore-out}
DEST="$OUT/fp8_decode"
mkdir -p "$DEST"
exec > >(tee -a "$DEST/log.txt") 2>&1
export PYTHONUNBUFFERED=1
date -u
if [ -n "${DRY:-}" ]; then
  ARGS="--small --device cpu"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  ARGS="--layers ${FP8_LAYERS:-4} --batch ${FP8_BATCH:-1,8,32,128}"
fi
timeout "${FP8_TIMEOUT:-210}" python3 bench/fp8_decode_step.py --out "$DEST" $ARGS ${FP8_ARGS:-}
rc=$?
echo "fp8_decode_step rc=$rc (0 ok, 1 a check FAILed, 2 ops missing, 124 timed out)"
ls -la "$DEST"
exit $rc
