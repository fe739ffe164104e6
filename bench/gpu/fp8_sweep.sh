#!/usr/bin/env bash
# The FP8 row kernels' launch sweep at 32k tokens (bench/fp8_kernels.py --sweep: the norm
# kernels under six configurations, silu_and_mul_fp8_quant under SWEEP_GATED), after the
# main table with torch.compile of the native functions in the same process (the reference
# a configuration is judged against). Expected runtime: about 2.5 min on an H200.
# Results: $OUT/fp8_sweep/fp8/ (bench.md, log.txt, raw.tgz with fp8_bench.json).
set -u
OUT=${OUT:-/tmp/opcore-out}
OUT="$OUT/fp8_sweep" STEPS=bench FP8_TOKENS=32768 FP8_BENCH_ARGS="--no-encoded --sweep" \
  FP8_BENCH_TIMEOUT="${FP8_SWEEP_TIMEOUT:-170}" bash bench/gpu/fp8.sh
