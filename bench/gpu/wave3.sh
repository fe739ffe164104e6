#!/usr/bin/env bash
# Wave 3's device check in one bounded pass (about 6 minutes on an H200): the cuda
# conformance without opcheck and compile (numerics, functional, in-place, determinism,
# supports_args, layers, attention), every sample's bound replay against its full path,
# host cost per call (no torch.compile), and the decode step eager and graphed.
set -u
dir="$OUT/wave3"; mkdir -p "$dir"
lscpu | grep -E "Model name" || true
echo "== conformance $(date -u +%T)"
timeout -k 5 "${W3_CONF_TIMEOUT:-170}" python3 -c "import sys; from opcore.cli import main; sys.exit(main())" \
  conformance --platform cuda --no-progress --report-dir "$dir/conformance" --overwrite \
  --checks numerics,functional,maybe_inplace,determinism,supports_args,layers,attention
echo "conformance rc=$?"
echo "== check_replay $(date -u +%T)"
timeout -k 5 "${W3_REPLAY_TIMEOUT:-70}" python3 bench/check_replay.py --out "$dir"
echo "check_replay rc=$?"
echo "== host_cost $(date -u +%T)"
timeout -k 5 "${W3_HOST_TIMEOUT:-110}" python3 bench/host_cost.py --no-compile --rounds 5 \
  --json "$dir/host_cost.json" --markdown "$dir/host_cost.md"
echo "host_cost rc=$?"
echo "== decode_step $(date -u +%T)"
timeout -k 5 "${W3_DECODE_TIMEOUT:-45}" python3 bench/decode_step.py --batch 1 --out "$dir/decode"
echo "decode_step rc=$?"
