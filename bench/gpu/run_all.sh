#!/usr/bin/env bash
# One batched device call for the GPU parts of several topics.
#
# Installs opcore, the cuda plugin, opcore-conformance and the carried wheels (.whl: liger,
# FlagGems and its sqlalchemy) into /tmp/site, then runs bench/gpu/<topic>.sh for each topic
# in GPU_STEPS, each under its own limit (LIMIT_<topic> seconds, default 120). A topic writes
# under "$OUT/<topic>/"; the driver packs that folder into <topic>.tgz in the real $OUT,
# because a device call returns at most 8 files. Single-GPU topics see GPU 0 only; the
# "collectives" topic sees every GPU of the machine.
#
#   GPU_STEPS="conformance tune properties" LIMIT_tune=200 bash bench/gpu/run_all.sh
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
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"

for topic in ${GPU_STEPS:-conformance}; do
  script=bench/gpu/$topic.sh
  limit_var=LIMIT_$topic
  limit=${!limit_var:-120}
  echo "== $topic (limit ${limit}s) $(date -u +%T)"
  start=$SECONDS
  if [ ! -f "$script" ]; then echo "$topic: no $script"; continue; fi
  if [ "$topic" = collectives ]; then
    timeout -k 10 "$limit" env OUT="$STAGE" bash "$script"
  else
    timeout -k 10 "$limit" env OUT="$STAGE" CUDA_VISIBLE_DEVICES=0 bash "$script"
  fi
  echo "$topic rc=$? in $((SECONDS - start)) s"
  mkdir -p "$STAGE/$topic"
  tar -czf "$FINAL_OUT/$topic.tgz" -C "$STAGE" "$topic"
done
date -u
ls -la "$FINAL_OUT"
