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
`opcore.attention.selector`) under private names; this module is their one public name.
"""

from __future__ import annotations

from opcore.attention.registry import _unregister_backend as unregister_backend
from opcore.attention.selector import _clear_selection_records as clear_selection_records

__all__ = ["clear_selection_records", "unregister_backend"]
