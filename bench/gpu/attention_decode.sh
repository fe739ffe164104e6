#!/usr/bin/env bash
# TRITON_PAGED on the GPU through bench/attention_decode.py: the attention conformance
# over the full grid (prefill, chunked, mixed and decode cases, the tile-edge ones
# included), then the decode benchmark (32/8 heads x 128, bf16, pages of 16, batch 1-256,
# context 1k-32k: graph time as a share of copy bandwidth, against SDPA). Issue 29 asks
# that decode stay at >= 88 % of copy at batch >= 64 after the prefill work.
# Bounded at ATT_DECODE_LIMIT seconds (default 280). ATT_DECODE_SKIP=conformance (or bench)
# leaves one part out; ATT_DECODE_QUICK=1 takes the quick grid.
# Run through run_all.sh (LANE0=attention_decode LIMIT_attention_decode=300).
# Results: $OUT/attention_decode/: attention_h200.json, attention_h200.log.
set -u
OUT=${OUT:-/tmp/opcore-out}
DIR="$OUT/attention_decode"
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1
ARGS="--out $DIR --skip ${ATT_DECODE_SKIP:-sweep}"
[ -n "${ATT_DECODE_QUICK:-}" ] && ARGS="$ARGS --quick"
echo "== attention_decode $(date -u +%T)"
timeout -k 5 "${ATT_DECODE_LIMIT:-280}" python3 bench/attention_decode.py $ARGS
echo "attention_decode rc=$? (124: timed out)"
date -u
