#!/usr/bin/env bash
# TRITON_PAGED on the GPU through bench/attention_decode.py: the attention conformance
# over the full grid (prefill, chunked, mixed and decode cases, the tile-edge ones
# included), then the decode benchmark (32/8 heads x 128, bf16, pages of 16, batch 1-256,
# context 1k-32k: graph time as a share of copy bandwidth, against SDPA). Issue 29 asks
# that decode stay at >= 88 % of copy at batch >= 64 after the prefill work.
# Bounded at ATT_DECODE_LIMIT seconds (default 280). ATT_DECODE_SKIP=conformance (or bench)
# leaves one part out; ATT_DECODE_QUICK=1 takes the quick grid.
# ATT_CONF_SHARDS=N: the conformance grid in N parallel processes first (each case builds
# its own kernel variant; one process took over 215 s on an H100 on 2026-12-06), each into
# conf<i>/, then the benchmark alone.
# Run through run_all.sh (LANE0=attention_decode LIMIT_attention_decode=300).
# Results: $OUT/attention_decode/: attention_h200.json, attention_h200.log.
set -u
OUT=${OUT:-/tmp/opcore-out}
DIR="$OUT/attention_decode"
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1
SKIP=${ATT_DECODE_SKIP:-sweep}
QUICK=""
[ -n "${ATT_DECODE_QUICK:-}" ] && QUICK="--quick"
echo "== attention_decode $(date -u +%T)"
if [ -n "${ATT_CONF_SHARDS:-}" ]; then
  pids=()
  for i in $(seq 0 $((ATT_CONF_SHARDS - 1))); do
    timeout -k 5 "${ATT_CONF_LIMIT:-150}" python3 bench/attention_decode.py $QUICK --skip bench,sweep \
      --shard "$i/$ATT_CONF_SHARDS" --out "$DIR/conf$i" > "$DIR/conf$i.log" 2>&1 & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  echo "conformance shards:"; grep -h "conformance on cuda\|FAIL\|ERROR" "$DIR"/conf*.log
  [ "$(grep -l "conformance on cuda" "$DIR"/conf*.log | wc -l)" -eq "$ATT_CONF_SHARDS" ] \
    || echo "conformance: a shard did not finish"
  SKIP="$SKIP,conformance"
fi
timeout -k 5 "${ATT_DECODE_LIMIT:-280}" python3 bench/attention_decode.py $QUICK --out "$DIR" \
  --skip "$SKIP"
echo "attention_decode rc=$? (124: timed out)"
date -u
