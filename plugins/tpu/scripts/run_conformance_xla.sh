#!/usr/bin/env bash
# Run the TPU plugin on XLA:CPU and record the result in
# plugins/tpu/reports/conformance-xla-cpu.md (and the run's certificate.json as
# plugins/tpu/reports/certificate-xla-cpu.json):
#   1. the conformance suite (`opcore conformance`, quick) with PJRT_DEVICE=CPU;
#   2. scripts/check_xla_tracing.py: native ops traced without host round-trips or graph
#      breaks (torch_xla metrics);
#   3. scripts/check_pallas.py: the Pallas kernel in the interpreter and lowered for TPU,
#      and the PALLAS attention plumbing on XLA:CPU.
#
#   XLA_VENV=/path/to/venv plugins/tpu/scripts/run_conformance_xla.sh
#
# The venv (torch 2.9.0 + torch_xla 2.9.0 + JAX 0.7.1, several GB) is created if missing.
# This repository's distributions are installed into it editable, without dependencies.
# Not part of CI: CI has no torch_xla venv and this run takes several minutes.
set -uo pipefail
cd "$(dirname "$0")/../../.."
VENV=${XLA_VENV:-/work/venvs/xla}
REPORT=plugins/tpu/reports/conformance-xla-cpu.md
CERTIFICATE=plugins/tpu/reports/certificate-xla-cpu.json
WORK=$(mktemp -d)

if [ ! -x "$VENV/bin/python" ]; then
    python3.11 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.9.0 torch_xla==2.9.0 jax==0.7.1 jaxlib==0.7.1 pytest
fi
"$VENV/bin/pip" install -q -U setuptools wheel >/dev/null 2>&1
"$VENV/bin/pip" install -q --no-deps --no-build-isolation \
    -e sdk -e conformance -e plugins/cpu -e plugins/tpu >/dev/null 2>&1

export PJRT_DEVICE=CPU
start=$(date -u +"%Y-%m-%d %H:%M UTC")
# The tree the run saw: the commit, and the tracked paths that differed from it.
tree="commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | awk '{print $2}' | grep -v -e "^$REPORT$" -e "^$CERTIFICATE$" | tr '\n' ' ')
[ -n "$dirty" ] && tree="$tree, with uncommitted changes in: $dirty"
versions=$("$VENV/bin/python" -c "
import platform, torch, torch_xla, opcore
try:
    import jax; j = jax.__version__
except Exception:
    j = 'not installed'
print(f'python {platform.python_version()}, torch {torch.__version__}, torch_xla {torch_xla.__version__}, jax {j}, opcore {opcore.__version__}')
" 2>/dev/null)
t0=$SECONDS
"$VENV/bin/opcore" conformance --quick --report-dir "$WORK/conformance" --overwrite --no-progress \
    > "$WORK/conformance.log" 2>&1
rc_conf=$?
t_conf=$((SECONDS - t0))
"$VENV/bin/python" plugins/tpu/scripts/check_xla_tracing.py > "$WORK/tracing.md" 2>"$WORK/tracing.err"
rc_trace=$?
"$VENV/bin/python" plugins/tpu/scripts/check_pallas.py > "$WORK/pallas.md" 2>"$WORK/pallas.err"
rc_pallas=$?

verdict() { [ "$1" -eq 0 ] && echo "pass" || echo "FAIL (exit $1)"; }
{
    echo "# opcore-plugin-tpu on XLA:CPU"
    echo
    echo "Last run: $start, by \`plugins/tpu/scripts/run_conformance_xla.sh\` (PJRT_DEVICE=CPU)."
    echo
    echo "- Environment: $versions"
    echo "- Tree: $tree"
    echo "- Host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; no TPU"
    echo "- Conformance (\`opcore conformance --quick\`, platform tpu on xla:0): $(verdict $rc_conf) in ${t_conf} s"
    echo "  - $(grep -E '^total:' "$WORK/conformance.log" || echo 'no summary line')"
    echo "- Tracing check: $(verdict $rc_trace)"
    echo "- Pallas checks: $(verdict $rc_pallas)"
    echo
    echo "Never run on a TPU: the Pallas rms_norm kernel on hardware, the PALLAS attention"
    echo "kernel, TPU device queries (memory, names), multi-chip (TPU_VISIBLE_CHIPS)."
    echo
    echo "## 1. Conformance suite"
    echo
    echo '```'
    sed -n '/^op /,/^total:/p' "$WORK/conformance.log"
    echo '```'
    echo
    echo "Cases needing attention (none expected; expectations in"
    echo "src/opcore_plugin_tpu/expectations.toml):"
    echo
    attention=$(sed -n '/need attention/,/^jsonl:/p' "$WORK/conformance.log" | grep -E '^\s+(FAIL|ERROR|XPASS)' | head -20)
    echo '```'
    echo "${attention:-none}"
    echo '```'
    echo
    echo "## 2. Native ops traced by XLA (torch_xla metrics)"
    echo
    cat "$WORK/tracing.md"
    echo
    echo "## 3. Pallas"
    echo
    cat "$WORK/pallas.md"
} > "$REPORT"
cp "$WORK/conformance/certificate.json" "$CERTIFICATE" 2>/dev/null || rm -f "$CERTIFICATE"
rm -rf "$WORK"
echo "wrote $REPORT (conformance $(verdict $rc_conf), tracing $(verdict $rc_trace), pallas $(verdict $rc_pallas))"
[ $rc_conf -eq 0 ] && [ $rc_trace -eq 0 ] && [ $rc_pallas -eq 0 ]
