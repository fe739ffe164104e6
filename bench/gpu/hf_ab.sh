#!/usr/bin/env bash
# Issue 19: eager decode, HF against opcore-patched, interleaved in one process per model
# (bench/hf_eager_ab.py: the per-round ratio, which the host-time drift between processes
# cannot bias). About 25 s per model on an H200 with the defaults; LIMIT_hf_ab=120.
# Writes $OUT/hf_ab/hf_eager_ab.{json,md}.   CPU plumbing: HF_TINY=1 OUT=/tmp/o bash ...
set -u
dir="${OUT:?OUT is not set}/hf_ab"; mkdir -p "$dir"
export PYTHONUNBUFFERED=1
extra=()
[ -n "${HF_TINY:-}" ] && extra=(--tiny)
timeout -k 5 "${HF_AB_TIMEOUT:-110}" python3 bench/hf_eager_ab.py --out "$dir" \
  --rounds "${HF_AB_ROUNDS:-6}" "${extra[@]}"
echo "hf_eager_ab rc=$?"
