"""Helpers for tests that register throw-away attention backends or make selections.

::

    from opcore.testing.attention import clear_selection_records, unregister_backend

    register_backend("MY_ATTN", "my_tests.backends.MyBackend")
    try:
        ...
    finally:
        unregister_backend("MY_ATTN")
        clear_selection_records()

Neither is part of `opcore.attention`: in a running process a registered name stays
(configs were checked against it, layers hold the class it selected) and the selection
records are the history `opcore info` shows.
They live beside the state they reset (`opcore.attention.registry`,
`opcore.attention.selector`), as `unregister_op` lives in `opcore.ir.registry`; the package
`opcore.attention` does not export them, and tests import them from here.
"""

from __future__ import annotations

from opcore.attention.registry import unregister_backend
from opcore.attention.selector import clear_selection_records

__all__ = ["clear_selection_records", "unregister_backend"]
