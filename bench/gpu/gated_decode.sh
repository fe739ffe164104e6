#!/usr/bin/env bash
# Issue 31's gated activations at decode sizes: bench/gated_decode.py (opcore's silu_and_mul,
# torch.compile of the native function and kernel variants: flat with d a compile-time
# constant or not, opcore's tile with d constant; graph replay, rounds rotated), then
# Inductor's generated kernel for 8 tokens x 9728 (TORCH_LOGS=output_code).
#   GATED_ARGS  extra arguments (say --tokens 1,8,32 --rounds 5)
# Results: $OUT/gated_decode/: gated_decode.json, bench.log, inductor_code.log.
set -u
dir="$OUT/gated_decode"; mkdir -p "$dir"
echo "== gated decode variants $(date -u +%T)"
timeout -k 5 150 python3 bench/gated_decode.py --json "$dir/gated_decode.json" ${GATED_ARGS:-} \
  > "$dir/bench.log" 2>&1
echo "bench rc=$?"; cat "$dir/bench.log"
TORCH_LOGS=output_code timeout -k 5 60 python3 bench/gated_decode.py --tokens 8 --inter 9728 \
  --rounds 1 > "$dir/inductor_code.log" 2>&1
echo "inductor rc=$? ($(wc -l < "$dir/inductor_code.log") lines)"
date -u
