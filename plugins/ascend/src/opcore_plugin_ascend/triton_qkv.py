"""`split_qkv_rmsnorm_rope` as one NPU-tiled Triton kernel, in portable Triton.

Tiling follows the Ascend vector cores rather than a GPU's many small programs:

* the grid is the number of vector cores (``vector_core_count``): one program per core,
  each owning a contiguous range of ``cdiv(tokens, programs)`` rows;
* a program walks its rows in chunks of ``ROWS`` tokens, ``ROWS`` chosen on the host so
  one chunk's fp32 working set fits the on-chip unified buffer (``ub_bytes``; 85 KiB by
  default, the budget vllm-ascend's kernel uses on Atlas A2);
* head counts are compile-time constants but the loop over heads is a real loop, not
  unrolled as in vllm-ascend's kernel: unrolled, 64 q heads took 150 s to compile for
  sm_90 on this project's CI machine, as a loop 1.8 s; token counts are runtime values
  (no recompilation per batch size);
* within a chunk, each q and k head is a ``[ROWS, HEAD_PAD]`` tile: its sum of squares
  gives the head's RMS, the normalised values stay in fp32 through the rotation, and the
  rotary partner of every element (the other half for NeoX, the neighbour for GPT-J) is
  read as a second gathered tile, so no register slicing or reshaping is needed;
* partial rotary: elements past ``rot_dim`` keep their normalised value;
* v heads are copied.

Only standard ``triton.language`` is used (no triton-ascend extensions), so the same
kernel runs under Triton's CPU interpreter (``TRITON_INTERPRET=1``, the tests) and on an
NVIDIA GPU (``plugins/ascend/scripts/check_triton_on_gpu.py``; it ran on an H200, see
``plugins/ascend/reports/triton-gpu.md``). It has never run on an
Ascend NPU.

Semantics are `opcore.ir.ops.split_qkv_rmsnorm_rope`'s: fp32 math from the normalisation
through the rotation, one rounding to the output dtype at the end.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# The unified-buffer budget per vector core (bytes) that vllm-ascend's kernel plans for on
# Atlas A2 (85 KiB of the 192 KiB UB, the rest for double buffering and the compiler).
DEFAULT_UB_BYTES = 87040
# fp32 [ROWS, HEAD_PAD] tiles live at once per head: x, partner, cos, sin, result.
LIVE_TILES = 5
MAX_ROWS = 64

INTERPRETED = False  # set below from the decorated kernel's type


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def rows_per_chunk(head_size: int, ub_bytes: int = DEFAULT_UB_BYTES) -> int:
    """Tokens per chunk: the largest power of two whose fp32 working set
    (``LIVE_TILES`` tiles of ``[ROWS, next_pow2(head_size)]``) fits ``ub_bytes``."""
    per_row = LIVE_TILES * 4 * next_pow2(head_size)
    rows = max(1, ub_bytes // per_row)
    return min(MAX_ROWS, 1 << (rows.bit_length() - 1))


def vector_core_count(device: torch.device) -> int:
    """Programs to launch: the device's vector cores on an NPU (triton-ascend reports
    ``num_vectorcore``), its multiprocessors on a GPU, a few on the interpreter."""
    if device.type == "npu":
        props = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)
        return int(props["num_vectorcore"])
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return min(8, os.cpu_count() or 1)


@triton.jit
def _norm_rope_head(
    src,
    dst,
    w_ptr,
    cos,
    sin,
    rows_2d,
    rmask_2d,
    d,
    dmask,
    partner,
    sign,
    rot_mask,
    src_stride,
    dst_stride,
    eps,
    head_size,
    HAS_W: tl.constexpr,
):
    m = rmask_2d & dmask[None, :]
    x = tl.load(src + rows_2d * src_stride + d[None, :], mask=m, other=0.0).to(tl.float32)
    xp = tl.load(src + rows_2d * src_stride + partner[None, :], mask=m, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / tl.cast(head_size, tl.float32) + eps)[:, None]
    y = x * rstd
    yp = xp * rstd
    if HAS_W:
        y = y * tl.load(w_ptr + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
        yp = yp * tl.load(w_ptr + partner, mask=dmask, other=0.0).to(tl.float32)[None, :]
    out = tl.where(rot_mask[None, :], y * cos + sign[None, :] * yp * sin, y)
    tl.store(dst + rows_2d * dst_stride + d[None, :], out.to(dst.dtype.element_ty), mask=m)


@triton.jit
def _split_qkv_rmsnorm_rope_tiled(
    qkv_ptr,
    qkv_stride,
    q_ptr,
    k_ptr,
    v_ptr,
    qw_ptr,
    kw_ptr,
    pos_ptr,
    cache_ptr,
    cache_stride,
    eps,
    n_tokens,
    rows_per_program,
    head_size,
    rot,
    half,
    N_Q_HEADS: tl.constexpr,
    N_KV_HEADS: tl.constexpr,
    IS_NEOX: tl.constexpr,
    HAS_QW: tl.constexpr,
    HAS_KW: tl.constexpr,
    ROWS: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    eps = tl.cast(eps, tl.float32)
    pid = tl.program_id(0)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, n_tokens)
    q_width = N_Q_HEADS * head_size
    kv_width = N_KV_HEADS * head_size

    # Per-element rotary bookkeeping, shared by every head and chunk.
    d = tl.arange(0, HEAD_PAD)
    dmask = d < head_size
    rot_mask = d < rot
    if IS_NEOX:
        lower = d < half
        partner = tl.where(lower, d + half, d - half)
        freq = tl.where(lower, d, d - half)
        sign = tl.where(lower, -1.0, 1.0)
    else:
        even = (d % 2) == 0
        partner = tl.where(even, d + 1, d - 1)
        freq = d // 2
        sign = tl.where(even, -1.0, 1.0)
    partner = tl.where(rot_mask, partner, d)
    freq = tl.where(rot_mask, freq, 0)

    # A while loop over the program's rows: its trip count is a runtime value (no
    # recompilation per token count), and it also runs under the interpreter.
    chunk = 0
    while chunk < rows_per_program:
        rows = first + chunk + tl.arange(0, ROWS)
        chunk += ROWS
        rmask = rows < last
        rows64 = rows.to(tl.int64)
        rows_2d = rows64[:, None]
        rmask_2d = rmask[:, None]
        pos = tl.load(pos_ptr + rows64, mask=rmask, other=0).to(tl.int64)
        cmask = rmask_2d & rot_mask[None, :]
        crow = cache_ptr + pos[:, None] * cache_stride + freq[None, :]
        cos = tl.load(crow, mask=cmask, other=1.0).to(tl.float32)
        sin = tl.load(crow + half, mask=cmask, other=0.0).to(tl.float32)
        for h in range(N_Q_HEADS):
            _norm_rope_head(
                qkv_ptr + h * head_size,
                q_ptr + h * head_size,
                qw_ptr,
                cos,
                sin,
                rows_2d,
                rmask_2d,
                d,
                dmask,
                partner,
                sign,
                rot_mask,
                qkv_stride,
                q_width,
                eps,
                head_size,
                HAS_QW,
            )
        for h in range(N_KV_HEADS):
            _norm_rope_head(
                qkv_ptr + q_width + h * head_size,
                k_ptr + h * head_size,
                kw_ptr,
                cos,
                sin,
                rows_2d,
                rmask_2d,
                d,
                dmask,
                partner,
                sign,
                rot_mask,
                qkv_stride,
                kv_width,
                eps,
                head_size,
                HAS_KW,
            )
            m = rmask_2d & dmask[None, :]
            v = tl.load(
                qkv_ptr + q_width + kv_width + h * head_size + rows_2d * qkv_stride + d[None, :],
                mask=m,
                other=0.0,
            )
            tl.store(v_ptr + h * head_size + rows_2d * kv_width + d[None, :], v, mask=m)


INTERPRETED = type(_split_qkv_rmsnorm_rope_tiled).__name__ == "InterpretedFunction"


def split_qkv_rmsnorm_rope_tiled(
    qkv,
    q_weight,
    k_weight,
    epsilon,
    positions,
    cos_sin_cache,
    num_heads,
    num_kv_heads,
    head_size,
    is_neox,
    *,
    num_programs: int | None = None,
    ub_bytes: int = DEFAULT_UB_BYTES,
):
    """Launch the kernel; same arguments and results as the op, plus the tiling knobs
    ``num_programs`` (default: `vector_core_count`) and ``ub_bytes`` (chunk sizing).

    ``qkv``'s rows must be reachable with one stride after flattening its leading dims
    (a 2-D row-strided view, or a contiguous tensor); the last dim must be contiguous."""
    lead = tuple(qkv.shape[:-1])
    n = positions.numel()
    width = qkv.shape[-1]
    flat = qkv.reshape(n, width)
    if flat.stride(-1) != 1:
        raise ValueError(
            "split_qkv_rmsnorm_rope (ascend triton): qkv's last dim must be contiguous, "
            f"strides {qkv.stride()}"
        )
    q_width, kv_width = num_heads * head_size, num_kv_heads * head_size
    q = torch.empty((n, q_width), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((n, kv_width), dtype=qkv.dtype, device=qkv.device)
    v = torch.empty((n, kv_width), dtype=qkv.dtype, device=qkv.device)
    if n:
        programs = num_programs or vector_core_count(qkv.device)
        programs = max(1, min(programs, n))
        per_program = -(-n // programs)
        programs = -(-n // per_program)
        rot = cos_sin_cache.shape[-1]
        pos = positions.reshape(-1).contiguous()
        _split_qkv_rmsnorm_rope_tiled[(programs,)](
            flat,
            flat.stride(0),
            q,
            k,
            v,
            q_weight if q_weight is not None else q,
            k_weight if k_weight is not None else k,
            pos,
            cos_sin_cache,
            cos_sin_cache.stride(0),
            float(epsilon),
            n,
            per_program,
            head_size,
            rot,
            rot // 2,
            N_Q_HEADS=num_heads,
            N_KV_HEADS=num_kv_heads,
            IS_NEOX=bool(is_neox),
            HAS_QW=q_weight is not None,
            HAS_KW=k_weight is not None,
            ROWS=min(rows_per_chunk(head_size, ub_bytes), next_pow2(per_program)),
            HEAD_PAD=next_pow2(head_size),
        )
    return q.reshape(*lead, q_width), k.reshape(*lead, kv_width), v.reshape(*lead, kv_width)
