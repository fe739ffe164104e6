#!/usr/bin/env bash
# The cuda platform's conformance (default selection) and the triton kernels' check against
# the float64 reference. About 3 minutes on an H200.
set -u
dir="$OUT/conformance"; mkdir -p "$dir"
timeout 60 python3 bench/check_triton.py --out "$dir"; echo "check_triton rc=$?"
timeout 240 python3 -c "import sys; from opcore.cli import main; sys.exit(main())" \
  conformance --platform cuda --no-progress --report-dir "$dir/report" --overwrite ${CONF_ARGS:-}
echo "conformance rc=$?"
