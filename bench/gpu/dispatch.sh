#!/usr/bin/env bash
# Eager dispatch overhead (bench/dispatch_overhead.py, docs/design.md's <= 1 us target) on
# the device machine's host CPU: the number an H200 user's process pays per op call, with
# and without a tuning table that routes a bucket (issue 17). CPU only, about 30 s.
# Writes $OUT/dispatch/dispatch_overhead.md.
set -u
dir="$OUT/dispatch"; mkdir -p "$dir"
lscpu | grep -E "Model name|^CPU\(s\)|MHz" || true
uptime
timeout -k 5 "${DISPATCH_TIMEOUT:-60}" python3 bench/dispatch_overhead.py \
  --number "${DISPATCH_NUMBER:-10000}" --repeat "${DISPATCH_REPEAT:-10}" \
  --markdown "$dir/dispatch_overhead.md"
echo "dispatch rc=$?"
uptime
