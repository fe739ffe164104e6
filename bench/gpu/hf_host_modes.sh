#!/usr/bin/env bash
# Issue 19: the graphed decode step's host time per CPU (bench/hf_host_modes.py), for the
# point run 4 missed (Qwen3-8B shape, 2 layers, batch 32), opcore-compile then compile,
# each compiled once in its own process (about 60-100 s each on an H200); HOST_MODES_TIMEOUT
# (default 120 s) bounds each. Writes $OUT/hf_host_modes/host_modes-*.json.
set -u
dir="${OUT:?OUT is not set}/hf_host_modes"; mkdir -p "$dir"
export PYTHONUNBUFFERED=1
for config in ${HOST_MODES_CONFIGS:-opcore-compile compile}; do
  echo "== $config $(date -u +%T)"
  timeout -k 5 "${HOST_MODES_TIMEOUT:-120}" python3 bench/hf_host_modes.py --model qwen3-8b \
    --config "$config" --batch 32 --out "$dir" 2>&1 | grep -E '^\{"cpu"|Error|error' | head -20
  echo "$config rc=${PIPESTATUS[0]}"
done
