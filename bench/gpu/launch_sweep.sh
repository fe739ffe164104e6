#!/usr/bin/env bash
# Issue 31's fit data: bench/sweep_launch.py (every launch configuration of the triton norm
# and gated-activation kernels over a wide grid of real-model shapes, with the eager
# composition and torch.compile beside them), after Inductor's generated code for the same
# two ops at a decode and a prefill size (TORCH_LOGS=output_code), which the activation
# kernel is compared against.
#   SWEEP_BUDGET  seconds after which the sweep starts no shape (default 170)
#   SWEEP_ARGS    extra arguments of sweep_launch.py (say --ops rms_norm --dtypes float16;
#                 --ops rotary_embedding,split_qkv_rmsnorm_rope for the head kernels' fit
#                 data, which still size their grids by a fixed 256 programs)
#   SWEEP_INDUCTOR=0  skip Inductor's generated code (a second sweep in the same call)
#   SWEEP_DIR     the results folder's name under $OUT (default launch_sweep)
# Results: $OUT/launch_sweep/: sweep.jsonl, sweep.log, inductor_code.log.
set -u
dir="$OUT/${SWEEP_DIR:-launch_sweep}"; mkdir -p "$dir"
if [ "${SWEEP_INDUCTOR:-1}" = 1 ]; then
echo "== inductor code $(date -u +%T)"
TORCH_LOGS=output_code timeout -k 5 60 python3 - > "$dir/inductor_code.log" 2>&1 <<'PY'
import torch, torch.nn.functional as F
def silu_and_mul(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
def rms_norm(x, w):
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + 1e-6) * w.float()).to(x.dtype)
for t in (1, 16384):
    x = torch.randn(t, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    print(f"#### silu_and_mul T={t}", flush=True)
    torch.compile(silu_and_mul, dynamic=False)(x)
    h = torch.randn(t, 7168, device="cuda", dtype=torch.bfloat16)
    print(f"#### rms_norm T={t} H=7168", flush=True)
    torch.compile(rms_norm, dynamic=False)(h, torch.randn(7168, device="cuda", dtype=torch.bfloat16))
    torch._dynamo.reset()
PY
echo "inductor rc=$? ($(wc -l < "$dir/inductor_code.log") lines)"
fi
echo "== sweep $(date -u +%T)"
python3 bench/sweep_launch.py --out "$dir" --budget-s "${SWEEP_BUDGET:-170}" \
  ${SWEEP_ARGS:---ops rms_norm,silu_and_mul} > "$dir/sweep.log" 2>&1
echo "sweep rc=$?"
tail -n 5 "$dir/sweep.log"
