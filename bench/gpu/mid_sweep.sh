#!/usr/bin/env bash
# Issue 31's fit data between decode and prefill sizes: the norm and gated-activation
# kernels' launch sweep at 64-1024 tokens, timed by graph replay (bench/sweep_launch.py's
# --graph-tokens), where the launch model is not fitted yet.
#   MID_SWEEP_BUDGET  seconds after which the sweep starts no shape (default 150)
#   MID_SWEEP_ARGS    extra arguments (say --hidden 2560,7168)
# Results: $OUT/mid_sweep/: sweep.jsonl, sweep.log.
set -u
SWEEP_DIR=mid_sweep SWEEP_INDUCTOR=0 SWEEP_BUDGET="${MID_SWEEP_BUDGET:-150}" \
  SWEEP_ARGS="--ops rms_norm,silu_and_mul --tokens 64,256,1024 ${MID_SWEEP_ARGS:-}" \
  bash bench/gpu/launch_sweep.sh
