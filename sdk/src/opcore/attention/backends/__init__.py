"""The SDK's attention backends: `torch_native` (the reference) and `triton_paged`."""
