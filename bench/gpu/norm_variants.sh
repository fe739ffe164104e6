#!/usr/bin/env bash
# Issue 31's two norm leads that no launch configuration closes: bench/norm_variants.py
# (1) rms_norm at 2048 and 16384 tokens of 5120 and 7168 columns, bf16: the one-pass kernel
# with and without cache hints, and Inductor's two-pass form, against the op,
# torch.compile and Liger (events after a cache flush); (2) fused_add_rms_norm at 1 and 8
# tokens in fp16: the weight multiplied in fp32 (opcore's arithmetic) or in the input dtype
# (Liger's), against the op and Liger (graph replay). About 60-90 s on an H100.
#   NORM_VARIANTS_LIMIT  seconds for each of the two runs (default 120)
# Results: $OUT/norm_variants/: many_rows.json, decode_fp16.json, *.log.
set -u
dir="$OUT/norm_variants"; mkdir -p "$dir"
echo "== rms_norm at many rows $(date -u +%T)"
timeout -k 5 "${NORM_VARIANTS_LIMIT:-120}" python3 bench/norm_variants.py --ops rms_norm \
  --tokens 2048,16384 --hidden 5120,7168 --peers compile,liger --json "$dir/many_rows.json" \
  > "$dir/many_rows.log" 2>&1
echo "rc=$?"; cat "$dir/many_rows.log"
echo "== fused_add_rms_norm at decode sizes, fp16 $(date -u +%T)"
timeout -k 5 "${NORM_VARIANTS_LIMIT:-120}" python3 bench/norm_variants.py \
  --ops fused_add_rms_norm --tokens 1,8 --hidden 5120,7168 --dtype float16 --peers liger \
  --json "$dir/decode_fp16.json" > "$dir/decode_fp16.log" 2>&1
echo "rc=$?"; cat "$dir/decode_fp16.log"
date -u
