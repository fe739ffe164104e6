"""The rotary kernel writes its rotation as explicit fused multiply-adds.

``a cos - b sin`` left to the compiler may be fused either way, and on an H100 the choice
followed the launch configuration (bench/head_exactness.py: 1-2 warps against 4-8 changed
the last bit of a few elements), which broke the declared batch invariance. The kernel is
compiled for sm_90 here (Triton's frontend; no GPU needed) in the layouts the launcher
picks at few and at many tokens, and its Triton IR must hold the four multiply-adds (q and
k, both members of a pair) with no product left to be fused by the compiler.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_COMPILE = """
import json
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from opcore.kernels.triton import rotary

if "nvidia" not in backends:
    print(json.dumps(None)); raise SystemExit
I = "i32"
sig = dict(pos_ptr="*i64", cache_ptr="*fp32", cache_stride=I, q_ptr="*bf16", q_tok=I,
           q_head=I, qo_ptr="*bf16", qo_tok=I, qo_head=I, n_q_heads=I, k_ptr="*bf16",
           k_tok=I, k_head=I, ko_ptr="*bf16", ko_tok=I, ko_head=I, n_k_heads=I, rot=I,
           half=I, head_size=I)
found = []
for warps, block_q, block_k in ((1, 4, 1), (2, 32, 8), (8, 32, 8)):
    consts = dict(IS_NEOX=True, HAS_KEY=True, BLOCK_Q=block_q, BLOCK_K=block_k, HALF_PAD=64,
                  COPY_TAIL=False, TAIL_PAD=1)
    src = ASTSource(fn=rotary._rotary_kernel,
                    signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
    ttir = compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ttir"]
    lines = [ln for ln in ttir.splitlines() if "tensor<" in ln]
    found.append({"warps": warps, "fma": sum("math.fma" in ln for ln in lines),
                  "mulf": sum("arith.mulf" in ln for ln in lines),
                  "addf": sum("arith.addf" in ln for ln in lines)})
print(json.dumps(found))
"""


def test_the_rotation_is_four_explicit_multiply_adds_in_every_layout() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if found is None:
        pytest.skip("this Triton has no NVIDIA backend to compile for")
    for variant in found:
        # one fma per rotated member of q and of k; the other product of each member is its
        # addend, so the products are exactly the four addends and nothing is left to fuse
        assert variant["fma"] == 4, variant
        assert variant["mulf"] == 4, variant
        assert variant["addf"] == 0, variant
