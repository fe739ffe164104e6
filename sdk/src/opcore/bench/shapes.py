"""The shape sets of `opcore bench`, as plain numbers (no torch, so the CLI's help can
quote them without loading it). `opcore.bench.cases` builds the tensors."""

DECODE_TOKENS = (1, 8, 32, 256)
PREFILL_TOKENS = (4096, 32768)
HIDDEN = (4096, 8192)
QUICK_TOKENS = (1, 8, 32)
QUICK_HIDDEN = (256,)

# Intermediate size and attention heads (q heads, kv heads, head size) per hidden size: one
# real model family each (Llama-3 8B and 70B on the default grid; off it Qwen2.5 1.5B, 7B
# and 14B, Llama-3.2 1B and 3B, Gemma-2 2B, Qwen3 4B, Mistral Large, Llama-3.1 405B and
# DeepSeek-V3's dense layers), so that `--hidden` off the default grid times shapes people
# run. Other sizes: 4 x hidden, hidden / 128 heads of 128 with 8 KV heads.
INTERMEDIATE = {
    1536: 8960,
    2048: 8192,
    2304: 9216,
    2560: 9728,
    3072: 8192,
    3584: 18944,
    4096: 14336,
    5120: 13824,
    7168: 18432,
    8192: 28672,
    12288: 28672,
    16384: 53248,
}
HEADS = {
    1536: (12, 2, 128),
    2048: (32, 8, 64),
    2304: (8, 4, 256),
    2560: (32, 8, 128),
    3072: (24, 8, 128),
    3584: (28, 4, 128),
    4096: (32, 8, 128),
    5120: (40, 8, 128),
    8192: (64, 8, 128),
    12288: (96, 8, 128),
    16384: (128, 8, 128),
}
MAX_POSITION = 32768 + 1
OPS = (
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "gelu_and_mul",
    "rotary_embedding",
    "split_qkv_rmsnorm_rope",
)
