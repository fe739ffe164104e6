"""`RocmCommunicator`: opcore's default torch.distributed communicator on RCCL (reached
through torch.distributed's "nccl" backend), declared capture-safe.

The collectives enqueue device work and wait only by ordering the current stream after
it (no host wait), which is what graph capture needs; `opcore conformance --world-size N`
checks the claim by capturing and replaying them. ``barrier`` waits on the host and is
never captured.
"""

from __future__ import annotations

from opcore.distributed import TorchCommunicator


class RocmCommunicator(TorchCommunicator):
    """`TorchCommunicator` with ``capture_safe = True``."""

    capture_safe = True
