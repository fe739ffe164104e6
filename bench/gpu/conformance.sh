#!/usr/bin/env bash
# The cuda platform's conformance (default selection) and the triton kernels' check against
# the float64 reference. About 3 minutes on an H200.
#   CHECK_TRITON_LIMIT  seconds for the check (default 150: on a fresh machine it compiles
#                       every kernel first, and 60 s ran out on an H100 on 2026-12-07);
#                       0 skips it
#   CONF_ARGS           extra arguments for the conformance run (say --ops rms_norm)
set -u
dir="$OUT/conformance"; mkdir -p "$dir"
check_limit=${CHECK_TRITON_LIMIT:-150}
if [ "$check_limit" != 0 ]; then
  timeout "$check_limit" python3 bench/check_triton.py --out "$dir"; echo "check_triton rc=$?"
fi
timeout 240 python3 -c "import sys; from opcore.cli import main; sys.exit(main())" \
  conformance --platform cuda --no-progress --report-dir "$dir/report" --overwrite ${CONF_ARGS:-}
echo "conformance rc=$?"
