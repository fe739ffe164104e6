#!/usr/bin/env bash
# One batched GPU run: install opcore + the cuda plugin + conformance (and the carried
# liger-kernel wheel) into /tmp/site, check every triton kernel against the reference,
# run `opcore conformance` on the cuda platform, `opcore bench`, and the decode-step
# benchmark. Results go to $OUT (at most 8 files come back; the rest is in rest.tgz).
#
#   run: bash bench/h200_run.sh            (carry: .whl with liger_kernel-*.whl)
# Environment: STEPS (default "check conformance bench decode"; also "compile", "ascend" and
# "conformance-full"), BENCH_ARGS, CONF_ARGS, CONF_FULL_ARGS, *_TIMEOUT, KEEP_GOING.
set -u
OUT=${OUT:-/tmp/opcore-out}
mkdir -p "$OUT/raw"
export PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
STEPS=${STEPS-"check conformance bench decode"}
exec > >(tee -a "$LOG") 2>&1

echo "== environment"
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  || echo "liger wheel not installed"
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site \
  ./sdk ./plugins/cuda ./conformance || { echo "install failed"; exit 1; }
export PYTHONPATH=/tmp/site
export PATH=/tmp/site/bin:$PATH
python3 - <<'PY'
import torch, triton, opcore.platforms as p
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
d = p.explain()
print("platform:", p.get_current_platform().name, "|", getattr(d, "rule", ""))
PY

for step in $STEPS; do
  case $step in
    check)
      echo "== check: triton kernels vs float64 reference on cuda"
      timeout "${CHECK_TIMEOUT:-120}" python3 bench/check_triton.py --out "$OUT" \
        || { [ -n "${KEEP_GOING:-}" ] || { echo "check failed: stopping"; break; }; } ;;
    conformance)
      echo "== opcore conformance --platform cuda"
      timeout "${CONF_TIMEOUT:-180}" python3 -c "import sys; from opcore.cli import main; sys.exit(main())" conformance --platform cuda --no-progress \
        --report-dir "$OUT/raw/conformance" --overwrite ${CONF_ARGS:-}
      echo "conformance rc=$?"
      cp "$OUT/raw/conformance/conformance.md" "$OUT/conformance.md" 2>/dev/null ;;
    conformance-full)
      echo "== opcore conformance --platform cuda --full ${CONF_FULL_ARGS:-}"
      timeout "${CONF_FULL_TIMEOUT:-300}" python3 -c "import sys; from opcore.cli import main; sys.exit(main())" conformance --platform cuda --no-progress \
        --full --report-dir "$OUT/raw/conformance-full" --overwrite ${CONF_FULL_ARGS:-}
      echo "conformance-full rc=$?"
      cp "$OUT/raw/conformance-full/conformance.md" "$OUT/conformance-full.md" 2>/dev/null ;;
    ascend)
      echo "== ascend plugin: the NPU-tiled Triton split_qkv_rmsnorm_rope on this GPU"
      timeout "${ASCEND_TIMEOUT:-200}" env PYTHONPATH="/tmp/site:plugins/ascend/src" python3 plugins/ascend/scripts/check_triton_on_gpu.py
      echo "ascend rc=$?" ;;
    bench)
      echo "== opcore bench"
      timeout "${BENCH_TIMEOUT:-330}" python3 -c "import sys; from opcore.cli import main; sys.exit(main())" bench --out "$OUT/raw/bench" \
        --jsonl "$OUT/raw/bench.jsonl" ${BENCH_ARGS:-}
      echo "bench rc=$?"
      cp "$OUT"/raw/bench/bench.{json,md,png} "$OUT/" 2>/dev/null ;;
    compile)
      echo "== compile: the decoder three ways (plain torch.compile, opcore lowering, opcore + fusion)"
      timeout "${COMPILE_TIMEOUT:-420}" python3 bench/compile_decoder.py --out "$OUT/raw/compile" ${COMPILE_ARGS:-}
      echo "compile rc=$?"
      cp "$OUT"/raw/compile/compile_decoder.{json,md} "$OUT/" 2>/dev/null ;;
    decode)
      echo "== decode step"
      timeout "${DECODE_TIMEOUT:-150}" python3 bench/decode_step.py --out "$OUT/raw/decode"
      cp "$OUT/raw/decode/decode_step.md" "$OUT/" 2>/dev/null ;;
  esac
done
tar -czf "$OUT/rest.tgz" -C "$OUT" raw && rm -rf "$OUT/raw"
ls -la "$OUT"
