#!/usr/bin/env bash
# Issue 31's norm rows at decode sizes: bench/norm_decode.py (rms_norm and
# fused_add_rms_norm at 1 and 8 tokens: the op as a user calls it, the triton provider, the
# kernel with the weight loaded after or before the row's reduction on about 8 and 16
# elements a thread, and the peers; graph replay, rounds rotated).
#   NORM_DECODE_ARGS  extra arguments (say --tokens 1,32,512 --hidden 4096,8192 --peers=)
# Results: $OUT/norm_decode/: norm_decode.json, bench.log.
set -u
dir="$OUT/norm_decode"; mkdir -p "$dir"
echo "== norm decode variants $(date -u +%T)"
timeout -k 5 "${NORM_DECODE_LIMIT:-170}" python3 bench/norm_decode.py --json "$dir/norm_decode.json" \
  ${NORM_DECODE_ARGS:-} > "$dir/bench.log" 2>&1
echo "bench rc=$?"; cat "$dir/bench.log"
date -u
