#!/usr/bin/env bash
# Issue 30's HF row: bench/hf_moe.py, a Qwen3-30B-A3B-shaped Qwen3-MoE model (2 decoder
# layers, random weights, bf16), eager prefill of 2048 and 8192 tokens: HF, opcore's
# apply_moe, and apply + apply_moe (the whole decoder) alternating in one process, then
# Liger's Qwen3-MoE patch.
# About a minute on an H200; bounded at HF_MOE_LIMIT seconds (default 150).
# Run through run_all.sh (LANE0=hf_moe LIMIT_hf_moe=170), which installs opcore and the
# carried Liger wheel (transformers is the device's own).
# Results: $OUT/hf_moe/: hf_moe.md, hf_moe.json, bench.log.
# CPU plumbing test: python bench/hf_moe.py --quick --out DIR.
set -u
OUT=${OUT:-/tmp/opcore-out}
DIR="$OUT/hf_moe"
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1
echo "== hf_moe $(date -u +%T)"
timeout -k 5 "${HF_MOE_LIMIT:-150}" python3 bench/hf_moe.py --out "$DIR" ${HF_MOE_ARGS:-} \
  > "$DIR/bench.log" 2>&1
echo "hf_moe rc=$? (0: opcore's next tokens equal HF's at every length; 124: timed out)"
cat "$DIR/hf_moe.md" 2>/dev/null || tail -30 "$DIR/bench.log"
date -u
