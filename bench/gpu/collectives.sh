#!/usr/bin/env bash
# Collectives on TWO GPUs of one host (NCCL), about 2-3 minutes in all (at most 6 min:
# LIMIT_collectives=360 in bench/gpu/run_all.sh):
#   1. opcore conformance --world-size 2 --platform cuda            (~30-40 s)
#   2. bench/collectives.py: all-reduce bus bandwidth 1 KB-256 MB against
#      torch.distributed.all_reduce alone; fused all-reduce + add + RMSNorm against the
#      unfused sequence at 1-256 tokens and 8192 (prefill), eager and graph   (~40 s)
#   3. bench/tp_decode_step.py --tp 1,2 --batch 1,8,32 (8 Llama-3-8B layers)  (~60 s)
# Started from the repo root after bench/h200_run.sh's (or bench/gpu/run_all.sh's) install
# lines, PYTHONPATH=/tmp/site, every GPU visible. Writes "$OUT/collectives/".
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1);
# nothing here calls a multicast API.
# Dry run of the plumbing on a CPU host (gloo, small sizes): SMALL=1 bash bench/gpu/collectives.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/opcore-out}
D="$OUT/collectives"
mkdir -p "$D"
exec > >(tee -a "$D/log.txt") 2>&1
PY=${PYTHON:-python3}

if [ -n "${SMALL:-}" ]; then
  PLATFORM=cpu
  CONF_TIMEOUT=120 BENCH_TIMEOUT=120 TP_TIMEOUT=180
  BENCH_ARGS="--small --max-bytes 65536 --tokens 1,16 --prefill 64 --hidden 256"
  TP_ARGS="--small --batch 1,4 --context 64 --dtype float32"
else
  PLATFORM=cuda
  CONF_TIMEOUT=150 BENCH_TIMEOUT=90 TP_TIMEOUT=120
  BENCH_ARGS=""
  TP_ARGS="--batch 1,8,32"
  gpus=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  echo "== collectives: $gpus GPU(s) visible"
  nvidia-smi topo -m || true
  if [ "${gpus:-0}" -lt 2 ]; then
    echo "collectives: needs 2 GPUs, $gpus visible; nothing run"
    exit 1
  fi
fi
date -u
git rev-parse HEAD 2>/dev/null || true

echo "== 1. opcore conformance --world-size 2 --platform $PLATFORM $(date -u +%T)"
timeout -k 10 "$CONF_TIMEOUT" $PY -c "import sys; from opcore.cli import main; sys.exit(main())" \
  conformance --world-size 2 --platform "$PLATFORM" --collective-timeout 60 --no-progress \
  --report-dir "$D/conformance" --overwrite
echo "conformance rc=$?"

echo "== 2. bench/collectives.py --world-size 2 $(date -u +%T)"
timeout -k 10 "$BENCH_TIMEOUT" env OPCORE_PLATFORM="$PLATFORM" $PY bench/collectives.py \
  --world-size 2 --timeout $((BENCH_TIMEOUT - 20)) --out "$D" $BENCH_ARGS
echo "collectives bench rc=$?"

echo "== 3. bench/tp_decode_step.py --tp 1,2 $(date -u +%T)"
timeout -k 10 "$TP_TIMEOUT" env OPCORE_PLATFORM="$PLATFORM" $PY bench/tp_decode_step.py \
  --tp 1,2 --timeout $(((TP_TIMEOUT - 20) / 2)) --out "$D" $TP_ARGS
echo "tp decode rc=$?"
date -u
ls -la "$D"
