"""Attention backend ``{{ cookiecutter.plugin_name.upper() }}_ATTN``: paged attention on {{ cookiecutter.plugin_name }} devices.

`{{ cookiecutter.__class_prefix }}Platform.import_kernels` registers it in the attention
registry under that name, and `get_attn_backend_candidates` lists it first, so the selector
tries it before the core's ``TORCH_NATIVE``. Registering is the only way a backend name
reaches its class: the registry maps each name to one class.

The example subclasses the core's ``TORCH_NATIVE`` backend, so as rendered it computes
exactly the reference and passes the conformance suite's attention cases. Make it yours:

* replace `write_kv` and `forward` with calls into your device's kernels (the contract:
  docs/attention.md, "The paged-KV contract");
* narrow the capability declarations below to what those kernels really support; the
  selector then says why it skips this backend for a layer it cannot serve;
* if your cache layout differs, override ``get_kv_cache_shape`` and ``split_kv_cache``.
"""

from __future__ import annotations

from opcore.attention.backends.torch_native import TorchNativeBackend


class {{ cookiecutter.__class_prefix }}AttentionBackend(TorchNativeBackend):
    """``TORCH_NATIVE``'s computation, declared for this platform's device only."""

    name = "{{ cookiecutter.plugin_name.upper() }}_ATTN"
    # Tensors on other devices are not ours to run: the selector skips this backend there.
    supported_device_types = ("{{ cookiecutter.device_type }}",)
    # TODO: what your kernels support, e.g. supported_dtypes = (torch.float16, torch.bfloat16),
    # supported_block_sizes = (MultipleOf(16),), supports_sliding_window = False.
