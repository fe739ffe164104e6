#!/usr/bin/env bash
# The cuda platform's whole default conformance selection (every check, quick samples) in
# one device call: the ops are split over SHARDS processes that share the one GPU and run
# at once (the cases are mostly host-bound, the lent host has 16 cores), plus one process
# for the attention backends. Each shard writes its own report; the summary lists each
# shard's totals, and the exit status is 1 when any shard failed, errored or did not end.
#   CONF_LIMIT   seconds each shard may run (default 300)
#   CONF_ARGS    extra arguments for every shard (say --full)
#   CONF_PLATFORM the platform (default cuda; cpu for a plumbing check here)
#   CONF_SHARDS  other op groups, ';' between shards (say "rms_norm;silu_and_mul,gelu_and_mul")
#   ATT_FULL_SHARDS=N also runs the attention backends' full grid (bench/attention_decode.py's
#                conformance on the GPU) in N more processes at the same time, into att<i>/
# Results: $OUT/conformance_sharded/<shard>/conformance.{md,jsonl}, summary.md.
set -u
dir="$OUT/conformance_sharded"; mkdir -p "$dir"
limit=${CONF_LIMIT:-300}
# Groups of about the same case count (7,442 quick cases on the CPU's listing).
shards=(
  "rotary_embedding"
  "rms_norm_dynamic_per_token_quant"
  "gelu_and_mul,silu_and_mul"
  "fused_add_rms_norm,rms_norm"
  "split_qkv_rmsnorm_rope,scaled_fp8_quant"
  "dynamic_per_token_scaled_fp8_quant,per_token_group_quant_fp8"
  "rms_norm_static_fp8_quant,fused_add_rms_norm_static_fp8_quant"
  "silu_and_mul_fp8_quant,silu_and_mul_per_token_group_fp8_quant"
  "fused_experts,grouped_topk,topk_softmax"
)
if [ -n "${CONF_SHARDS:-}" ]; then IFS=';' read -r -a shards <<< "$CONF_SHARDS"; fi
conf() { timeout -k 5 "$limit" python3 -c "import sys; from opcore.cli import main; sys.exit(main())" \
  conformance --platform "${CONF_PLATFORM:-cuda}" --no-progress --overwrite ${CONF_ARGS:-} "$@"; }
echo "== conformance in $(( ${#shards[@]} + 1 )) shards $(date -u +%T)"
pids=()
for i in "${!shards[@]}"; do
  conf --ops "${shards[$i]}" --report-dir "$dir/s$i" >"$dir/s$i.log" 2>&1 & pids+=($!)
done
conf --checks attention --report-dir "$dir/attention" >"$dir/attention.log" 2>&1 & pids+=($!)
n_att=${ATT_FULL_SHARDS:-0}
for ((i = 0; i < n_att; i++)); do
  timeout -k 5 "$limit" python3 bench/attention_decode.py --skip bench,sweep --shard "$i/$n_att" \
    --out "$dir/att$i" >"$dir/att$i.log" 2>&1 & pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
echo "== done $(date -u +%T)"
{
  echo "| shard | ops | pass | fail | xfail | xpass | skip | unsupported | n/a | error | total |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  row() {  # row NAME OPS: the totals row of one shard's report, then its verdict
    local r h
    r=$(grep -A2 '^| pass |' "$dir/$1/conformance.md" 2>/dev/null | tail -1)
    h=$(head -1 "$dir/$1/conformance.md" 2>/dev/null)
    echo "| $1 | $2 | ${r#| } ${h##* }"
  }
  for i in "${!shards[@]}"; do row "s$i" "${shards[$i]}"; done
  row attention "(attention backends)"
} | tee "$dir/summary.md"
if [ "$n_att" -gt 0 ]; then
  echo "attention full grid, $n_att processes:"
  grep -h "conformance on cuda" "$dir"/att*.log | tee -a "$dir/summary.md"
  [ "$(grep -l "conformance on cuda" "$dir"/att*.log | wc -l)" -eq "$n_att" ] \
    || echo "attention full grid: a process did not finish" | tee -a "$dir/summary.md"
fi
grep -h -E "^(FAIL|ERROR)|rerun" "$dir"/*.log | head -40
exit $status
