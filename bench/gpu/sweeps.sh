#!/usr/bin/env bash
# Launch-settings sweeps on the GPU: the paged prefill kernel per head size
# (bench/attention_prefill.py --sweep: issue 29's worst rows, head sizes 64/128/256, short
# and long sequences, against SDPA flash) and the MoE grouped GEMMs per shape
# (bench/moe.py --sweep: Qwen3-30B-A3B and Mixtral-8x7B at prefill and decode sizes,
# against FlagGems and Liger).
#
# Bounded: the prefill sweep starts no problem after SWEEP_PREFILL_S seconds (default 150),
# the MoE sweep none after SWEEP_MOE_S (default 200); each timing takes about
# SWEEP_REP_MS (default 30) ms. Run through run_all.sh (LANE0=sweeps LIMIT_sweeps=420).
# Results: $OUT/sweeps/: attention_prefill_sweep.json, moe_sweep.json, prefill.log, moe.log.
# SWEEP_ONLY=prefill or moe runs one of the two.
# CPU plumbing test: SWEEP_DRY=1 bash bench/gpu/sweeps.sh (one tiny problem each, under
# Triton's interpreter). SWEEP_SET picks the prefill settings (launch, tma, pack, rows or short:
# bench/attention_prefill.py --sweep-set); SWEEP_PREFILL_ARGS adds its options (say
# "--only head_size=64").
set -u
OUT=${OUT:-/tmp/opcore-out}
DIR="$OUT/sweeps"
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1 LIGER_FUSED_MOE_AUTOTUNE=${LIGER_FUSED_MOE_AUTOTUNE:-0}
REP=${SWEEP_REP_MS:-30}
Q=""
[ -n "${SWEEP_DRY:-}" ] && Q="--quick"

ONLY=${SWEEP_ONLY:-}

if [ "$ONLY" != moe ]; then
  echo "== sweeps: prefill attention $(date -u +%T)"
  timeout -k 5 $(( ${SWEEP_PREFILL_S:-150} + 60 )) python3 bench/attention_prefill.py --sweep $Q \
    --sweep-set "${SWEEP_SET:-launch}" --budget-s "${SWEEP_PREFILL_S:-150}" --rep-ms "$REP" \
    --out "$DIR" ${SWEEP_PREFILL_ARGS:-} > "$DIR/prefill.log" 2>&1
  echo "prefill sweep rc=$?"
  tail -n 5 "$DIR/prefill.log"
fi

if [ "$ONLY" != prefill ]; then
  echo "== sweeps: MoE grouped GEMMs $(date -u +%T)"
  timeout -k 5 $(( ${SWEEP_MOE_S:-200} + 60 )) python3 bench/moe.py --sweep $Q \
    --budget-s "${SWEEP_MOE_S:-200}" --rep-ms "$REP" --out "$DIR" > "$DIR/moe.log" 2>&1
  echo "moe sweep rc=$?"
  tail -n 5 "$DIR/moe.log"
fi
date -u
