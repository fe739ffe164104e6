"""Attention backends: capabilities, one selection algorithm, paged KV.

* `AttentionBackend` (`backend.py`): capability declarations, ``validate_configuration``,
  the paged-KV contract (cache shape, ``write_kv``, ``forward``).
* `AttentionSelectorConfig` (`selector_config.py`): what a layer asks for.
* Registry (`registry.py`): backend name -> class path, the one route from a name to a
  class; plugins call `register_backend` from their platform's ``import_kernels``.
* Selector (`selector.py`): `select_backend` / `get_attn_backend`, `selection_info`.
* `PagedAttentionMetadata` (`paged.py`): one mixed prefill/decode batch.
* Backends: ``TORCH_NATIVE`` (reference, any device), ``TRITON_PAGED`` (Triton kernels).
* `opcore.attention.testing`: the conformance cases and their runner.
"""

from opcore.attention.backend import AttentionBackend, MultipleOf
from opcore.attention.paged import PagedAttentionMetadata, compute_slot_mapping
from opcore.attention.registry import (
    UnknownBackendError,
    backend_class_path,
    known_names,
    register_backend,
    registered_backends,
)
from opcore.attention.selector import (
    AttentionSelectionError,
    Selection,
    get_attn_backend,
    probe_selection,
    select_backend,
    selection_info,
)
from opcore.attention.selector_config import AttentionSelectorConfig

__all__ = [
    "AttentionBackend",
    "AttentionSelectionError",
    "AttentionSelectorConfig",
    "MultipleOf",
    "PagedAttentionMetadata",
    "Selection",
    "UnknownBackendError",
    "backend_class_path",
    "compute_slot_mapping",
    "get_attn_backend",
    "known_names",
    "probe_selection",
    "register_backend",
    "registered_backends",
    "select_backend",
    "selection_info",
]
