#!/usr/bin/env bash
# The per-call path on the device (issue "the per-call path"): every op sample's second call
# (served by the signature's bound replay) against its first, bitwise (bench/check_replay.py);
# host and device cost per call of every Triton-provided op against its peers
# (bench/host_cost.py); the decode step eager and graphed (bench/decode_step.py); dispatch
# of a no-op provider on this host (bench/dispatch_overhead.py).
#   HOST_COST_ARGS  extra arguments of host_cost.py (say --no-compile)
#   HOST_SKIP       space-separated parts to leave out: replay host decode dispatch
set -u
dir="$OUT/host_cost"; mkdir -p "$dir"
lscpu | grep -E "Model name|^CPU\(s\)" || true
skip=" ${HOST_SKIP:-} "
if [[ "$skip" != *" replay "* ]]; then
  echo "== check_replay $(date -u +%T)"
  timeout -k 5 "${REPLAY_TIMEOUT:-150}" python3 bench/check_replay.py --out "$dir"
  echo "check_replay rc=$?"
fi
if [[ "$skip" != *" host "* ]]; then
  echo "== host_cost $(date -u +%T)"
  timeout -k 5 "${HOST_TIMEOUT:-300}" python3 bench/host_cost.py --json "$dir/host_cost.json" \
    --markdown "$dir/host_cost.md" ${HOST_COST_ARGS:-}
  echo "host_cost rc=$?"
fi
if [[ "$skip" != *" decode "* ]]; then
  echo "== decode_step $(date -u +%T)"
  timeout -k 5 "${DECODE_TIMEOUT:-120}" python3 bench/decode_step.py --batch 1,8 \
    --out "$dir/decode"
  echo "decode_step rc=$?"
fi
if [[ "$skip" != *" dispatch "* ]]; then
  echo "== dispatch_overhead $(date -u +%T)"
  timeout -k 5 60 python3 bench/dispatch_overhead.py --number 10000 --repeat 10 \
    --markdown "$dir/dispatch_overhead.md"
  echo "dispatch rc=$?"
fi
