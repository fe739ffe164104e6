#!/usr/bin/env bash
# One batched device call for the GPU parts of several topics.
#
# Installs opcore, the cuda plugin, opcore-conformance and the carried wheels (.whl: liger,
# FlagGems and its sqlalchemy) into /tmp/site, then runs bench/gpu/<topic>.sh for each topic,
# each under its own limit (LIMIT_<topic> seconds, default 120):
#   ALL_GPUS  topics that need every GPU (collectives), run first, one after another;
#   LANE0     topics run one after another on GPU 0;
#   LANE1     topics run one after another on GPU 1, at the same time as LANE0 when the
#             machine has two GPUs (else after LANE0, on GPU 0).
# A topic writes under "$OUT/<topic>/" (its console output goes to <topic>/console.log);
# the driver packs each topic folder into <topic>.tgz in the real $OUT, because a device
# call returns at most 8 files.
#
#   ALL_GPUS=collectives LANE0="properties fp8" LANE1="fp8_decode" bash bench/gpu/run_all.sh
set -u
FINAL_OUT=${OUT:-/tmp/opcore-out}
STAGE=/tmp/opcore-stage
mkdir -p "$FINAL_OUT" "$STAGE"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
exec > >(tee -a "$FINAL_OUT/log.txt") 2>&1

echo "== environment"; date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl/*.whl || echo "carried wheels not installed"
fi
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-compile \
  --target /tmp/site ./sdk ./plugins/cuda ./conformance || { echo "install failed"; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
echo "gpus: $gpus"

run_topic() {  # run_topic TOPIC VISIBLE_DEVICES(or "all")
  local topic=$1 visible=$2 limit_var="LIMIT_$1" start=$SECONDS rc
  local limit=${!limit_var:-120}
  # A fresh folder: the stage outlives a call on a warm machine, and files a topic appends
  # to (opcore bench --jsonl) would otherwise mix two calls' runs.
  rm -rf "${STAGE:?}/$topic"; mkdir -p "$STAGE/$topic"
  echo "== $topic on GPU ${visible} (limit ${limit}s) $(date -u +%T)"
  if [ ! -f "bench/gpu/$topic.sh" ]; then echo "$topic: no bench/gpu/$topic.sh"; return; fi
  if [ "$visible" = all ]; then
    timeout -k 10 "$limit" env OUT="$STAGE" bash "bench/gpu/$topic.sh" \
      >"$STAGE/$topic/console.log" 2>&1
  else
    timeout -k 10 "$limit" env OUT="$STAGE" CUDA_VISIBLE_DEVICES="$visible" \
      bash "bench/gpu/$topic.sh" >"$STAGE/$topic/console.log" 2>&1
  fi
  rc=$?
  echo "== $topic rc=$rc in $((SECONDS - start)) s; last lines:"
  tail -n 15 "$STAGE/$topic/console.log" | sed "s/^/  [$topic] /"
  tar -czf "$FINAL_OUT/$topic.tgz" -C "$STAGE" "$topic"
}
run_lane() { local gpu=$1; shift; for t in "$@"; do run_topic "$t" "$gpu"; done; }

for t in ${ALL_GPUS:-}; do run_topic "$t" all; done
if [ "$gpus" -ge 2 ]; then
  # Wait for the two lanes by pid: a bare `wait` also waits for the `tee` of the log's
  # process substitution, which ends only when this script does (a deadlock until the
  # call's limit: two device calls of 2026-12-01 lost 3.5 and 2 minutes to it).
  run_lane 0 ${LANE0:-} & lane0=$!
  run_lane 1 ${LANE1:-} & lane1=$!
  wait "$lane0" "$lane1"
else
  run_lane 0 ${LANE0:-} ${LANE1:-}
fi
date -u
ls -la "$FINAL_OUT"
