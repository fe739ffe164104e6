"""The shape sets of `opcore bench`, as plain numbers (no torch, so the CLI's help can
quote them without loading it). `opcore.bench.cases` builds the tensors."""

DECODE_TOKENS = (1, 8, 32, 256)
PREFILL_TOKENS = (4096, 32768)
HIDDEN = (4096, 8192)
QUICK_TOKENS = (1, 8, 32)
QUICK_HIDDEN = (256,)

INTERMEDIATE = {4096: 14336, 8192: 28672}
HEADS = {4096: (32, 8, 128), 8192: (64, 8, 128)}  # (q heads, kv heads, head size)
MAX_POSITION = 32768 + 1
OPS = (
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "gelu_and_mul",
    "rotary_embedding",
    "split_qkv_rmsnorm_rope",
)
