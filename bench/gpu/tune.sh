#!/usr/bin/env bash
# Issue 17: `opcore tune` on the GPU over the issue's grid, then `opcore bench` of the triton
# provider with tuning off and on over the same rows plus sizes the table was not tuned on.
#
# Device time: about 5 minutes on an H200 (tune: TUNE_BUDGET_S=150 s of search plus start-up;
# bench off and on: about 60 s each, JIT compiles included). Every step under `timeout`;
# LIMIT_tune=420 in run_all.sh covers it. SKIP_BENCH=1: the tune step only (about 3 min).
#
# Grid (bf16): tokens 1,32,4096,32768 x hidden 4096, 8192; the bench's Llama layouts give
# norms at hidden 4096/8192, silu/gelu_and_mul at intermediate 14336/28672, rotary and the
# fused split at 32/8 and 64/8 heads of 128. Unseen: hidden 5120, 7168 and tokens 2048, 16384.
#
# Writes $OUT/tune/: table.json (the tuning table), tune.log, bench-off/ and bench-on/
# (bench.json, bench.md), compare.md (before/after per row, tuned rows and unseen rows).
#
#   bash bench/gpu/tune.sh                         (after bench/gpu/run_all.sh's install)
#   DRY=1 OUT=/tmp/o bash bench/gpu/tune.sh        (CPU, Triton interpreter, tiny grid)
# Knobs: TUNE_BUDGET_S, TUNE_OPS, BENCH_PEERS (extra bench providers for the "on" run, e.g.
# "compile,F.rms_norm,liger,flaggems"; default none: the peers cost compile time).
set -u
dir="$OUT/tune"; mkdir -p "$dir"
ops=${TUNE_OPS:-rms_norm,fused_add_rms_norm,silu_and_mul,gelu_and_mul,rotary_embedding,split_qkv_rmsnorm_rope}
if [ -n "${DRY:-}" ]; then
  export TRITON_INTERPRET=1 OPCORE_PLATFORM=cpu
  # the cpu platform does not load the Triton kernels itself
  cli=(python3 -c "import sys, opcore.kernels.triton; from opcore.cli import main; sys.exit(main())")
  tokens=1,8; hidden=256; all_tokens=1,8,16; all_hidden=256,384; quick=--quick
  budget=${TUNE_BUDGET_S:-20}; ops=${TUNE_OPS:-rms_norm,silu_and_mul}; t_tune=300; t_bench=300
else
  cli=(python3 -c "import sys; from opcore.cli import main; sys.exit(main())")
  tokens=1,32,4096,32768; hidden=4096,8192; all_tokens=1,32,2048,4096,16384,32768
  all_hidden=4096,8192,5120,7168; quick=
  budget=${TUNE_BUDGET_S:-150}; t_tune=$((budget + 90)); t_bench=${BENCH_TIMEOUT:-100}
fi
echo "== opcore tune (budget ${budget}s) $(date -u +%T)"
timeout "$t_tune" env OPCORE_TUNING=off "${cli[@]}" tune --ops "$ops" --tokens "$tokens" \
  --hidden "$hidden" --dtypes bfloat16 --budget-s "$budget" --out "$dir/table.json" $quick \
  2>&1 | tee "$dir/tune.log"
echo "tune rc=${PIPESTATUS[0]}"
[ -f "$dir/table.json" ] || { echo "no table written: stopping"; exit 1; }

[ -n "${SKIP_BENCH:-}" ] && { echo "SKIP_BENCH set: no bench"; exit 0; }
peers=${BENCH_PEERS:+,$BENCH_PEERS}
for mode in off on; do
  echo "== opcore bench, tuning $mode $(date -u +%T)"
  setting=off; [ "$mode" = on ] && setting="$dir/table.json"
  provs=triton; [ "$mode" = on ] && provs="triton$peers"
  timeout "$t_bench" env OPCORE_TUNING="$setting" "${cli[@]}" bench --ops "$ops" \
    --providers "$provs" --tokens "$all_tokens" --hidden "$all_hidden" --rep-ms 15 $quick \
    --out "$dir/bench-$mode" > "$dir/bench-$mode.log" 2>&1
  echo "bench $mode rc=$?"; tail -3 "$dir/bench-$mode.log"
done
python3 bench/tune_compare.py --table "$dir/table.json" --off "$dir/bench-off/bench.json" \
  --on "$dir/bench-on/bench.json" --out "$dir/compare.md"
echo "compare rc=$?"
date -u
