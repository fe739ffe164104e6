#!/usr/bin/env bash
# Issue 19's H200 table: Hugging Face Llama-3-8B and Qwen3-8B shapes (2 decoder layers,
# random weights, bf16), batch 1 and 32, prefill 2048 tokens, 128 decode steps after a
# 512-token prompt: HF eager, HF + Liger, HF + torch.compile (CUDA graphs, static cache),
# opcore-patched eager, opcore-patched + opcore compile backend (CUDA graphs, static
# cache); one profiled decode step of each eager run (kernels, CPU time, breakdown by
# module, host syncs, dtypes). See bench/hf_models.py.
#
# Total runtime: about 4.5 minutes on an H200 for everything (bench/hf_models.py --budget
# 270 stops it by then, keeping what finished; run it with LIMIT_hf=330); the hard limit
# here is HF_BUDGET + 25 s. The graphed configurations are compiled first, together, each
# in the process that then measures it (at most HF_COMPILE_LIMIT s, default 150, and 80 %
# of the budget); then each configuration is measured alone on the GPU: the graphed ones
# first, then the eager ones; last, if time is left, the eager configurations again with
# cuDNN attention disabled (HF_EAGER_NOCUDNN) and on a StaticCache (HF_EAGER_STATIC).
# Installs nothing: it assumes the install lines of bench/gpu/run_all.sh (or
# bench/h200_run.sh) ran, PYTHONPATH=/tmp/site, liger_kernel from the carried wheel;
# without liger the liger rows say it is missing.
# Results: $OUT/hf/hf_models.{json,md} (rewritten after each configuration), one log and
# partial result per configuration under $OUT/hf/logs.
#
#   GPU:  OUT=/tmp/out bash bench/gpu/hf.sh
#   second run of 2026-12-01, the compiled rows only (<= 200 s; see
#   bench/results/2026-12-01-h200-hf/README.md):
#         LANE0=hf LIMIT_hf=200 HF_CONFIGS=compile,opcore-compile HF_BUDGET=175 \
#         HF_EAGER_NOCUDNN=hf,opcore,liger HF_EAGER_STATIC=hf,opcore bash bench/gpu/run_all.sh
#   a third run, the eager decode rows still missing (10 runs of ~16 s; no compile):
#         LANE0=hf LIMIT_hf=200 HF_CONFIGS=none HF_MODELS=qwen3-8b,llama3-8b HF_BUDGET=175 \
#         HF_EAGER_NOCUDNN=liger,hf,opcore HF_EAGER_STATIC=hf,opcore bash bench/gpu/run_all.sh
#   CPU check of the plumbing (tiny configs, 1 layer, a few steps):
#         HF_TINY=1 OUT=/tmp/out bash bench/gpu/hf.sh
# Environment: HF_LAYERS (2), HF_BUDGET (270 s), HF_CONFIGS (or none), HF_MODELS, HF_COMPILE_LIMIT
# (150 s), HF_EAGER_STATIC (hf,opcore), HF_EAGER_NOCUDNN (none), HF_ARGS (extra args).
set -u
dir="${OUT:?OUT is not set}/hf"
mkdir -p "$dir"
export PYTHONUNBUFFERED=1
if python3 -c "import liger_kernel" 2>/dev/null; then
  python3 -c 'import importlib.metadata as m; print("liger-kernel", m.version("liger-kernel"))'
else
  echo "liger_kernel is not installed: the liger configuration will fail and say so; the rest runs"
fi
args=(--profile --budget "${HF_BUDGET:-270}" --out "$dir"
  --eager-static "${HF_EAGER_STATIC-hf,opcore}" --eager-nocudnn "${HF_EAGER_NOCUDNN:-}"
  --prewarm-timeout "${HF_COMPILE_LIMIT:-150}")
if [ -n "${HF_TINY:-}" ]; then
  args+=(--tiny)
else
  args+=(--layers "${HF_LAYERS:-2}")
fi
[ -n "${HF_CONFIGS:-}" ] && args+=(--configs "$HF_CONFIGS")
[ -n "${HF_MODELS:-}" ] && args+=(--models "$HF_MODELS")
# shellcheck disable=SC2086  # HF_ARGS is a list of arguments
timeout -k 5 "$(( ${HF_BUDGET:-270} + 25 ))" python3 bench/hf_models.py "${args[@]}" ${HF_ARGS:-}
echo "hf_models rc=$?"
