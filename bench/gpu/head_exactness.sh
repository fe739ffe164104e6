#!/usr/bin/env bash
# The rotary kernel's launch configurations against the default one, bit for bit
# (bench/head_exactness.py). Expected runtime: about 30 s on an H200 (Triton builds of
# the configurations' variants). Results: $OUT/head_exactness/: head_exactness.log and .json.
set -u
OUT=${OUT:-/tmp/opcore-out}
DIR="$OUT/head_exactness"
mkdir -p "$DIR"
python3 bench/head_exactness.py --hidden "${HEAD_HIDDEN:-4096,2048}" \
  --tokens "${HEAD_TOKENS:-2,16,256}" --json "$DIR/head_exactness.json" 2>&1 \
  | tee "$DIR/head_exactness.log"
