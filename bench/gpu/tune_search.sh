#!/usr/bin/env bash
# Issue 17, the search: `opcore tune` on the device over the issue's grid (tokens 1, 32,
# 4096, 32768 x hidden 4096, 8192, bf16, the six ops with launch spaces), with tuning off so
# that the heuristic is the incumbent. The table it writes is the one the cuda plugin ships
# (copy $OUT/tune_search/table.json to
# plugins/cuda/src/opcore_plugin_cuda/tuning/nvidia-h200-torch2.11-triton3.6.json), then
# bench/gpu/tune.sh measures it against no table and the peers.
#
# Device time: the search's own budget (TUNE_BUDGET, default 230 s; it stops trying
# candidates when the budget ends and records what it measured) plus the process start.
# In bench/gpu/run_all.sh: LIMIT_tune_search=260.
#
#   bash bench/gpu/tune_search.sh                    (after bench/gpu/run_all.sh's install)
#   DRY=1 OUT=/tmp/o bash bench/gpu/tune_search.sh   (CPU, Triton interpreter, tiny shapes)
set -u
dir="$OUT/tune_search"; mkdir -p "$dir"
ops=${TUNE_OPS:-rms_norm,fused_add_rms_norm,silu_and_mul,gelu_and_mul,rotary_embedding,split_qkv_rmsnorm_rope}
budget=${TUNE_BUDGET:-230}
if [ -n "${DRY:-}" ]; then
  export TRITON_INTERPRET=1 OPCORE_PLATFORM=cpu
  cli=(python3 -c "import sys, opcore.kernels.triton; from opcore.cli import main; sys.exit(main())")
  grid=(--tokens 1,8 --hidden 256 --quick); ops=${TUNE_OPS:-rms_norm,silu_and_mul}
else
  cli=(python3 -c "import sys; from opcore.cli import main; sys.exit(main())")
  grid=(--tokens 1,32,4096,32768 --hidden 4096,8192)
fi
echo "== opcore tune (budget ${budget}s) $(date -u +%T)"
SECONDS=0
OPCORE_TUNING=off "${cli[@]}" tune --ops "$ops" "${grid[@]}" --dtypes bfloat16 \
  --budget-s "$budget" --out "$dir/table.json" > "$dir/tune.log" 2>&1
echo "tune rc=$? in ${SECONDS} s"
tail -n 25 "$dir/tune.log"
date -u
