#!/usr/bin/env bash
# Issue 31's fit data for the head kernels (rotary_embedding, split_qkv_rmsnorm_rope): every
# power-of-two split of a token's heads on 1-8 warps, at the real models' head layouts
# (bench/sweep_launch.py --ops rotary_embedding,split_qkv_rmsnorm_rope), 1-16384 tokens.
#   HEAD_SWEEP_BUDGET  seconds after which the sweep starts no shape (default 150)
#   HEAD_SWEEP_ARGS    extra arguments (say --dtypes float16)
# Results: $OUT/head_sweep/: sweep.jsonl, sweep.log.
set -u
SWEEP_DIR=head_sweep SWEEP_INDUCTOR=0 SWEEP_BUDGET="${HEAD_SWEEP_BUDGET:-150}" \
  SWEEP_ARGS="--ops rotary_embedding,split_qkv_rmsnorm_rope ${HEAD_SWEEP_ARGS:-}" \
  bash bench/gpu/launch_sweep.sh
