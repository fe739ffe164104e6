#!/usr/bin/env bash
# Provider properties on the device (issue 18, docs/properties.md). At most PROPS_TOTAL
# seconds (default 115, inside run_all.sh's default limit of 120): each step is bounded by
# what is left (the conformance step, interrupted, still writes what it checked).
#
# 1. bench/decode_step.py --batch-invariance 32 with OPCORE_BATCH_INVARIANT=1: a sequence
#    decoded alone and inside a batch of 32, bitwise; the mode's cost (batch_invariance.md).
# 2. The planted defects: a provider declaring batch_invariant that picks its block size
#    from the row count, one declaring capture_safe that calls .item(); both must fail
#    (planted.md says whether they did).
# 3. `opcore conformance --platform cuda` property checks (batch_invariance, determinism,
#    capture_safety) of every first-party provider, with the attention backends' property
#    checks; summary table in properties.md.
#
# Started from the repo root after bench/gpu/run_all.sh's install lines (PYTHONPATH=/tmp/site);
# writes under "$OUT/properties/". DRY=1: the same steps on the CPU (platform cpu, small
# decoder), to test the plumbing without a GPU.
set -u
TOTAL=${PROPS_TOTAL:-115}
SECONDS=0
OUT=${OUT:-/tmp/opcore-out}
DIR="$OUT/properties"
mkdir -p "$DIR"
PLATFORM=cuda
DECODE_ARGS=""
if [ -n "${DRY:-}" ]; then PLATFORM=cpu; DECODE_ARGS="--tiny --context 64"; fi
PLANTED_PATH="${PYTHONPATH:+$PYTHONPATH:}conformance/tests"
left() { local n=$(( TOTAL - SECONDS - $1 )); [ "$n" -lt 10 ] && n=10; echo "$n"; }
OPCORE="import sys; from opcore.cli import main; sys.exit(main())"
CHECKS=batch_invariance,capture_safety,determinism
CHECKS=$CHECKS,attention.batch_invariance,attention.capture_safety,attention.determinism

echo "== properties: decode step, alone vs in a batch of 32 $(date -u +%T)"
timeout "${PROPS_DECODE_TIMEOUT:-45}" env OPCORE_BATCH_INVARIANT=1 python3 bench/decode_step.py \
  --batch-invariance 32 --out "$DIR" $DECODE_ARGS > "$DIR/decode.log" 2>&1
echo "decode rc=$? (0: bitwise identical)"
cat "$DIR/batch_invariance.md" 2>/dev/null || tail -20 "$DIR/decode.log"

echo "== properties: planted defects $(date -u +%T)"
timeout 30 env PYTHONPATH="$PLANTED_PATH" python3 -c "$OPCORE" \
  conformance --platform "$PLATFORM" --import planted_properties --ops rms_norm \
  --providers planted_rowblock,planted_item --dtypes float32 \
  --checks batch_invariance,capture_safety --expectations none --no-progress \
  --report-dir "$DIR/planted" --overwrite > "$DIR/planted.log" 2>&1
echo "planted rc=$? (1 expected: the planted defects fail)"
python3 - "$DIR" <<'PY'
import json, sys
d = sys.argv[1]
want = {
    ("batch_invariance", "planted_rowblock"): "fail",
    ("capture_safety", "planted_item"): "fail",
}
lines = ["| check | provider | status | expected | message |", "|---|---|---|---|---|"]
for line in open(f"{d}/planted/conformance.jsonl", encoding="utf-8"):
    r = json.loads(line)
    key = (r.get("check"), r.get("provider"))
    if r.get("type") == "case" and key in want:
        lines.append(f"| {key[0]} | {key[1]} | {r['status']} | {want[key]} (not_applicable "
                     f"without graphs) | {(r['message'] or '')[:300]} |")
open(f"{d}/planted.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY

echo "== properties: conformance property checks on $PLATFORM $(date -u +%T)"
timeout -s INT -k 5 "$(left 3)" python3 -c "$OPCORE" conformance --platform "$PLATFORM" \
  --checks "$CHECKS" --expectations none --no-progress \
  --report-dir "$DIR/conformance" --overwrite > "$DIR/conformance.log" 2>&1
echo "conformance rc=$?"
grep -E "^total" "$DIR/conformance.log"
python3 bench/properties_summary.py "$DIR/conformance/conformance.jsonl" \
  --out "$DIR/properties.md" > /dev/null && sed -n '/## Declared but failing/,$p' "$DIR/properties.md"

date -u
