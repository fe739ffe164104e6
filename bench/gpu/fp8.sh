#!/usr/bin/env bash
# FP8 quantization kernels on the GPU (issue 21, part A). Expected runtime: about 2.5
# minutes on an H200 (Triton builds of the kernels' ~300 variants, in 8 parallel processes,
# then shared through Triton's on-disk cache; torch.compile of six native functions about
# 1 min); each step is bounded by its timeout (worst case about 9 min).
#
# Steps (STEPS, default "check conformance bench"):
#   check        every fp8 triton kernel vs the float64 native reference, quick samples of the
#                eight ops in fp32/fp16/bf16 plus rows longer than one register tile
#                (bench/fp8_kernels.py check)
#   conformance  opcore conformance --platform cuda on the eight fp8 ops, one process per
#                op: the op checks (numerics in fp8 codes, functional, supports_args,
#                opcheck, determinism, batch_invariance, capture_safety) in all dtypes,
#                then compile.matches_eager and compile.lowering in bfloat16 (the lead's full
#                run has the platform and decoder-level checks)
#   bench        each fused kernel vs the unfused pair of opcore triton providers vs
#                torch.compile of the native function, bf16, hidden 4096 (gated 2 x 14336),
#                tokens ${FP8_TOKENS:-32768,8192,1024,64}; % of copy bandwidth (a 2 GiB
#                copy_ timed with events, as every other result); FP8_BENCH_ARGS adds
#                bench/fp8_kernels.py options (--no-compile, --no-encoded, --sweep: the row
#                kernels under six launch configurations at the largest token count)
# Short re-run (expected 60-80 s on an H200, bounded at 85 s: about 30 Triton builds, no
# check, no conformance, 32k only, no torch.compile, no encoded path, then the launch sweep
# of the three row kernels; the main table is written before the sweep starts):
#   STEPS=bench FP8_TOKENS=32768 FP8_BENCH_ARGS="--no-compile --no-encoded --sweep" \
#     FP8_BENCH_TIMEOUT=85 OUT=... bash bench/gpu/fp8.sh
# Run from the repo root after bench/h200_run.sh's install lines (PYTHONPATH=/tmp/site).
# Results: $OUT/fp8/: log.txt (every step's output), conformance-checks.md,
# conformance-compile.md (the per-op summaries, concatenated), bench.md, raw.tgz (check
# and conformance JSON/JSONL/logs per op, fp8_bench.json): five files.
# CPU plumbing test: FP8_DRY=1 TRITON_INTERPRET=1 bash bench/gpu/fp8.sh (quick shapes;
# conformance on the cpu platform with the interpreted kernels, two ops).
set -u
OUT=${OUT:-/tmp/opcore-out}
DIR="$OUT/fp8"
mkdir -p "$DIR/raw"
export PYTHONUNBUFFERED=1
STEPS=${STEPS-"check conformance bench"}
OPS=scaled_fp8_quant,dynamic_per_token_scaled_fp8_quant,per_token_group_quant_fp8
OPS=$OPS,rms_norm_static_fp8_quant,fused_add_rms_norm_static_fp8_quant
OPS=$OPS,rms_norm_dynamic_per_token_quant,silu_and_mul_fp8_quant
OPS=$OPS,silu_and_mul_per_token_group_fp8_quant
PLATFORM=cuda
QUICK=""
IMPORT=""
if [ -n "${FP8_DRY:-}" ]; then
  PLATFORM=cpu
  QUICK="--quick"
  IMPORT="--import opcore.kernels.triton"
  OPS=scaled_fp8_quant,silu_and_mul_fp8_quant
fi
CONF=(python3 -c "import sys; from opcore.cli import main; sys.exit(main())" conformance
      --platform "$PLATFORM" $IMPORT --no-progress --overwrite)
CHECKS=numerics,functional,supports_args,opcheck,determinism,batch_invariance,capture_safety
exec > >(tee -a "$DIR/log.txt") 2>&1
echo "== fp8 ($STEPS) $(date -u)"
for step in $STEPS; do
  case $step in
    check)
      # One process per op, in parallel: most of the time is Triton building the kernels'
      # variants (one per dtype and block shape), which then sit in Triton's on-disk cache
      # for the conformance steps.
      echo "== fp8 check: triton kernels vs the float64 reference (one process per op)"
      pids=()
      for op in ${OPS//,/ }; do
        timeout "${FP8_CHECK_TIMEOUT:-150}" python3 bench/fp8_kernels.py check --quick \
          --ops "$op" --out "$DIR/raw" > "$DIR/raw/check_$op.log" 2>&1 &
        pids+=($!)
      done
      rc=0
      for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
      cat "$DIR"/raw/check_*.log
      echo "fp8 check rc=$rc" ;;
    conformance)
      # One process per op again (the batch-invariance and compile checks build more
      # variants); each writes its own report directory, the summaries are concatenated.
      for part in checks compile; do
        if [ $part = checks ]; then extra=(--checks "$CHECKS"); else
          extra=(--checks compile.matches_eager,compile.lowering --dtypes bfloat16); fi
        echo "== fp8 conformance --platform $PLATFORM ${extra[*]} (one process per op)"
        pids=()
        for op in ${OPS//,/ }; do
          timeout "${FP8_CONF_TIMEOUT:-200}" "${CONF[@]}" --ops "$op" "${extra[@]}" \
            --report-dir "$DIR/raw/conformance-$part-$op" > "$DIR/raw/conf_${part}_${op}.log" 2>&1 &
          pids+=($!)
        done
        rc=0
        for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
        grep -h "^total" "$DIR"/raw/conf_"$part"_*.log
        echo "fp8 conformance $part rc=$rc"
        cat "$DIR"/raw/conformance-$part-*/conformance.md > "$DIR/conformance-$part.md" 2>/dev/null
      done ;;
    bench)
      echo "== fp8 bench: fused vs unfused pair vs torch.compile"
      timeout "${FP8_BENCH_TIMEOUT:-240}" python3 bench/fp8_kernels.py bench $QUICK \
        --tokens "${FP8_TOKENS:-32768,8192,1024,64}" ${FP8_BENCH_ARGS:-} --out "$DIR/raw"
      echo "fp8 bench rc=$?"
      cp "$DIR/raw/fp8_bench.md" "$DIR/bench.md" 2>/dev/null ;;
  esac
done
tar -czf "$DIR/raw.tgz" -C "$DIR" raw 2>/dev/null && rm -rf "$DIR/raw"
ls -la "$DIR"
