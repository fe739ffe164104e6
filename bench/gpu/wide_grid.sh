#!/usr/bin/env bash
# Issue 31's wide grid: `opcore bench` with OPCORE_TUNING=off (the launch model alone) on
# real-model shapes nobody tuned (opcore.bench.shapes: hidden 2560/3584/5120/7168 with
# their models' intermediates 9728/18944/13824/18432), against torch.compile of the native
# function (static shapes), F.rms_norm, Liger and FlagGems in the same process; then
# bench/tune_compare.py's rows (within 3 % of the best peer, ahead, misses with causes).
#   WIDE_OPS WIDE_HIDDEN WIDE_TOKENS WIDE_DTYPE  override the grid (defaults below)
#   WIDE_ROUNDS  opcore bench --rounds (default 3): providers timed in rotated order; one
#               pass left 2048-token rows to the order they ran in (1.04-1.05x Liger in
#               one pass, 0.99x rotated: bench/results/2026-12-07-h100-session14)
#   WIDE_LIMIT  seconds for the bench (default 200; the grid took about 135 s on an H100 at
#               three rounds, so run_all.sh needs LIMIT_wide_grid of about 240); rows not
#               reached are missing
#   WIDE_ON=1   then the same grid with the shipped H200 table named by OPCORE_TUNING:
#               these shapes have no entry of their own, so every row it changes is a
#               configuration lent by a tuned shape (runtime.lend_row); compare_on.md sets
#               it against the model alone (WIDE_ON_LIMIT, default 200 s)
# Results: $OUT/wide_grid/: off.jsonl, off/ (bench.json, bench.md), compare.md/json; with
# WIDE_ON=1 also on.jsonl, on/, compare_on.md/json.
set -u
dir="$OUT/wide_grid"; mkdir -p "$dir"
ops=${WIDE_OPS:-rms_norm,fused_add_rms_norm,silu_and_mul,gelu_and_mul}
hidden=${WIDE_HIDDEN:-3584,7168,2560,5120}
tokens=${WIDE_TOKENS:-1,8,2048,16384}
dtype=${WIDE_DTYPE:-bfloat16}
peers=compile,F.rms_norm,liger,flaggems
table=${TUNE_TABLE:-$(python3 bench/gpu/shipped_table.py)}  # this GPU's shipped table
[ -f "$table" ] || { echo "no shipped table for this GPU (TUNE_TABLE names one): stopping"; exit 1; }
echo "== wide grid, OPCORE_TUNING=off, $dtype $(date -u +%T)"
timeout -k 5 "${WIDE_LIMIT:-200}" env OPCORE_TUNING=off python3 -c \
  "import sys; from opcore.cli import main; sys.exit(main())" bench --ops "$ops" \
  --providers "triton,$peers" --tokens "$tokens" --hidden "$hidden" --dtype "$dtype" \
  --rep-ms "${WIDE_REP_MS:-30}" --rounds "${WIDE_ROUNDS:-3}" --out "$dir/off" --jsonl "$dir/off.jsonl" > "$dir/off.log" 2>&1
echo "bench rc=$?; $(grep -c '"provider"' "$dir/off.jsonl" 2>/dev/null || echo 0) records"
# Tuning off on both sides: every row is "unseen" by the table, so the comparison is the
# launch model against the peers.
timeout 20 python3 bench/tune_compare.py --table "$table" --off "$dir/off.jsonl" \
  --on "$dir/off.jsonl" --out "$dir/compare.md" --json "$dir/compare.json" > "$dir/compare.log" 2>&1
echo "compare rc=$?"
grep -E "^- " "$dir/compare.md" 2>/dev/null | head -12
if [ "${WIDE_ON:-0}" = 1 ]; then
  echo "== wide grid, OPCORE_TUNING=<shipped table> (lent configurations), $dtype $(date -u +%T)"
  timeout -k 5 "${WIDE_ON_LIMIT:-200}" env OPCORE_TUNING="$table" python3 -c \
    "import sys; from opcore.cli import main; sys.exit(main())" bench --ops "$ops" \
    --providers "triton,$peers" --tokens "$tokens" --hidden "$hidden" --dtype "$dtype" \
    --rep-ms "${WIDE_REP_MS:-30}" --rounds "${WIDE_ROUNDS:-3}" --out "$dir/on" --jsonl "$dir/on.jsonl" > "$dir/on.log" 2>&1
  echo "bench rc=$?; $(grep -c '"provider"' "$dir/on.jsonl" 2>/dev/null || echo 0) records"
  timeout 20 python3 bench/tune_compare.py --table "$table" --off "$dir/off.jsonl" \
    --on "$dir/on.jsonl" --out "$dir/compare_on.md" --json "$dir/compare_on.json" \
    > "$dir/compare_on.log" 2>&1
  echo "compare (lent) rc=$?"
  grep -E "^- " "$dir/compare_on.md" 2>/dev/null | head -12
fi
date -u
