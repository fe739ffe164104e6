"""What of the TPU plugin's Pallas code can be checked without a TPU, checked:

1. ``pallas_kernels.rms_norm`` in Pallas' interpreter (JAX on the CPU) against a float64
   reference, over odd row counts (partial last block), ``variance_size``, no weight, and
   fp32/bf16/fp16.
2. The same kernel lowered *for TPU* (Mosaic) on this CPU host: the TPU block-shape rules
   are enforced at lowering, so a kernel that a TPU would reject fails here.
3. The ``PALLAS`` attention backend's cache layout, ``write_kv`` and metadata mapping, on
   the XLA device (``PJRT_DEVICE=CPU``) through torch_xla's non-kernel reference path
   (``use_kernel=False``), against opcore's float64 ``TORCH_NATIVE`` reference on the
   conformance suite's attention cases that the backend accepts (the first 4 of each batch mix).

Run in the torch_xla venv with JAX (``pip install jax==0.7.1 jaxlib==0.7.1``):

    PJRT_DEVICE=CPU python plugins/tpu/scripts/check_pallas.py

Prints Markdown; exits 1 on any failure. The kernel itself, on a TPU, is not checked here.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import torch

from opcore_plugin_tpu import pallas_kernels as pk

MAX_ATTENTION_CASES_PER_MIX = 4
DTYPES = {
    "float32": (jnp.float32, 2e-6),
    "bfloat16": (jnp.bfloat16, 1.6e-2),
    "float16": (jnp.float16, 2e-3),
}


def check_kernel_interpret() -> list[str]:
    rng = np.random.default_rng(0)
    rows_out, failures = [], 0
    for rows, hidden, var_size, weight in [
        (1, 128, None, True),
        (5, 256, None, True),
        (37, 512, 256, True),
        (64, 384, None, False),
        (1000, 128, None, True),
    ]:
        for dname, (dtype, tol) in DTYPES.items():
            x = rng.standard_normal((rows, hidden)).astype(np.float32)
            w = (1 + 0.5 * rng.standard_normal((1, hidden))).astype(np.float32) if weight else None
            xj = jnp.asarray(x).astype(dtype)
            wj = None if w is None else jnp.asarray(w).astype(dtype)
            block = pk.pick_block_rows(rows, hidden, jnp.dtype(dtype).itemsize)
            out = pk.rms_norm(
                xj, wj, epsilon=1e-6, variance_size=var_size, block_rows=block, interpret=True
            )
            xr = np.asarray(xj.astype(jnp.float32), dtype=np.float64)
            xv = xr if var_size is None else xr[:, :var_size]
            ref = xr / np.sqrt((xv**2).mean(-1, keepdims=True) + 1e-6)
            if wj is not None:
                ref = ref * np.asarray(wj.astype(jnp.float32), dtype=np.float64)
            err = float(
                np.max(
                    np.abs(np.asarray(out.astype(jnp.float32), dtype=np.float64) - ref)
                    / (1 + np.abs(ref))
                )
            )
            ok = out.dtype == xj.dtype and err <= tol
            failures += not ok
            rows_out.append(
                f"| {rows}x{hidden} | {var_size} | {weight} | {dname} | {block} | {err:.2e} | "
                f"{'ok' if ok else 'FAIL'} |"
            )
    print("### 1. Pallas rms_norm kernel in the interpreter (JAX CPU)\n")
    print("| shape | variance_size | weight | dtype | block_rows | max err/(1+|ref|) | verdict |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows_out))
    print()
    return ["kernel"] * failures


def check_tpu_lowering() -> list[str]:
    print("### 2. Lowered for TPU (Mosaic) on this host\n")
    failures = []
    for rows, hidden, dtype in [
        (64, 4096, jnp.bfloat16),
        (7, 128, jnp.float32),
        (1000, 5120, jnp.bfloat16),
    ]:
        x = jnp.zeros((rows, hidden), dtype)
        w = jnp.zeros((1, hidden), dtype)
        block = pk.pick_block_rows(rows, hidden, jnp.dtype(dtype).itemsize)
        try:
            text = (
                pk.rms_norm.trace(x, w, epsilon=1e-6, variance_size=None, block_rows=block)
                .lower(lowering_platforms=("tpu",))
                .as_text()
            )
            ok = "tpu_custom_call" in text
            detail = "tpu_custom_call emitted" if ok else "no tpu_custom_call in the lowered module"
        except Exception as exc:  # a lowering error is the finding
            ok, detail = False, f"{type(exc).__name__}: {str(exc)[:200]}"
        if not ok:
            failures.append("lowering")
        print(
            f"- {rows}x{hidden} {jnp.dtype(dtype).name}, block_rows {block}: "
            f"{'ok' if ok else 'FAIL'} ({detail})"
        )
    print()
    return failures


def check_attention_plumbing() -> list[str]:
    import torch_xla

    from opcore.attention import testing as T
    from opcore_plugin_tpu.attention import PallasBackend

    class PallasReferencePath(PallasBackend):
        use_kernel = False  # torch_xla's non-kernel path: same arguments, runs on XLA:CPU

    device = torch_xla.device()
    print("### 3. PALLAS attention plumbing on XLA:CPU (torch_xla non-kernel path)\n")
    print("| case | max abs err | max rel err | rtol | verdict |")
    print("|---|---|---|---|---|")
    failures, ran = [], 0
    per_mix: dict[str, int] = {}
    for case in T.conformance_cases(quick=False):
        mix = case.name.split("-")[0]
        if per_mix.get(mix, 0) >= MAX_ATTENTION_CASES_PER_MIX:
            continue
        cfg = case.selector_config("xla")
        reasons = [r for r in PallasBackend.validate_configuration(cfg) if "needs a TPU" not in r]
        if reasons:
            continue
        data = T.make_case_data(case)
        ref = T.reference_output(case, data)
        out = T.run_backend(PallasReferencePath, case, data, device, case.dtype).to(torch.float64)
        atol, rtol = T.TOLERANCES[case.dtype]
        diff = (out - ref).abs()
        max_abs = float(diff.max())
        max_rel = float((diff / (atol / rtol + ref.abs())).max())
        ok = bool(torch.isfinite(out).all()) and max_rel <= rtol
        ran += 1
        per_mix[mix] = per_mix.get(mix, 0) + 1
        if not ok:
            failures.append(case.name)
        print(
            f"| {case.name} | {max_abs:.2e} | {max_rel:.2e} | {rtol:g} | {'ok' if ok else 'FAIL'} |"
        )
    print(f"\n{ran} cases accepted by PALLAS's declarations ran.\n")
    if ran == 0:
        failures.append("no attention case ran")
    return failures


def main() -> int:
    print(f"jax {jax.__version__} (backend {jax.default_backend()}), torch {torch.__version__}\n")
    failures = check_kernel_interpret() + check_tpu_lowering() + check_attention_plumbing()
    print(f"**{'FAIL: ' + ', '.join(failures) if failures else 'all checks passed'}**")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
