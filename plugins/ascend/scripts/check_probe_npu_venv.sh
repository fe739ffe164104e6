#!/usr/bin/env bash
# What `opcore info` says about the Ascend plugin on a host where torch_npu is installed
# but the CANN runtime is not (this project's machines). Records the result in
# plugins/ascend/reports/probe-without-cann.md.
#
#   NPU_VENV=/path/to/venv plugins/ascend/scripts/check_probe_npu_venv.sh
#
# The venv is created if missing: torch 2.13.0 (CPU build) + torch-npu 2.13.0. This
# repository's distributions are installed into it editable, without dependencies.
set -uo pipefail
cd "$(dirname "$0")/../../.."
VENV=${NPU_VENV:-/work/venvs/npu}
REPORT=plugins/ascend/reports/probe-without-cann.md

if [ ! -x "$VENV/bin/python" ]; then
    python3.11 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.13.0 torch-npu==2.13.0
fi
"$VENV/bin/pip" install -q -U setuptools wheel >/dev/null 2>&1
"$VENV/bin/pip" install -q --no-deps --no-build-isolation -e sdk -e plugins/cpu -e plugins/ascend >/dev/null 2>&1

versions=$("$VENV/bin/python" -c "
import importlib.metadata as md, platform
names = ['torch', 'torch-npu', 'opcore', 'opcore-plugin-ascend']
print(f'python {platform.python_version()}, ' + ', '.join(f'{n} {md.version(n)}' for n in names))
")
plain=$(cd /tmp && "$VENV/bin/python" -c "import torch" 2>&1 | tail -1)
info=$(cd /tmp && TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$VENV/bin/opcore" info --json 2>/dev/null | "$VENV/bin/python" -c "
import json, sys
d = json.load(sys.stdin)
print(f\"platform: {d['platform']['name']} (rule {d['rule']})\")
for c in d['candidates']:
    state = 'activated' if c['activated'] else 'inactive'
    print(f\"{c['name']} [{c['tier']}] {state}: {c['reason'] or c['error'] or ''}\")
")
{
    echo "# Ascend probe on a host with torch_npu and without CANN"
    echo
    echo "Last run: $(date -u +'%Y-%m-%d %H:%M UTC'), by \`plugins/ascend/scripts/check_probe_npu_venv.sh\`."
    echo
    echo "- Packages: $versions"
    echo "- \`import torch\` with torch_npu installed and no CANN (torch imports installed device"
    echo "  extensions itself, so it fails before opcore runs):"
    echo
    echo '```'
    echo "$plain"
    echo '```'
    echo
    echo "- \`TORCH_DEVICE_BACKEND_AUTOLOAD=0 opcore info --json\`, summarised:"
    echo
    echo '```'
    echo "$info"
    echo '```'
} > "$REPORT"
echo "wrote $REPORT"
echo "$info" | grep -q "^ascend .*inactive: torch_npu failed to import: ImportError: libhccl.so"
