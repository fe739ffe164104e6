"""opcore.distributed: communicators, named process groups and a local multi-process launcher.

Built on ``torch.distributed``; opcore adds no transport of its own.

- `Communicator`: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``,
  ``barrier`` over one process group, every wait bounded by ``timeout_s``;
  `TorchCommunicator` is the default implementation. A platform supplies its own class
  through ``Platform.get_device_communicator_cls()`` and declares ``capture_safe`` on it.
- Groups by name (collective ops take a group *name*, since a ``torch.library`` schema has
  no process-group type): `init_distributed` (registers ``"world"``), `register_group`,
  `get_communicator`, `group_names`, `unregister_group`, `shutdown`.
- `run_ranks`: run a function on N local processes in one group (127.0.0.1 only, bounded
  waits, clean teardown); `check` turns failed ranks into one `RanksFailed` message.

The collective ops themselves are `opcore.ir.ops.all_reduce` and
`opcore.ir.ops.fused_all_reduce_add_rms_norm` (see `opcore.ir.collective_ops()`). Details:
docs/distributed.md.
"""

from opcore.distributed.communicator import (
    CollectiveError,
    CollectiveTimeout,
    Communicator,
    TorchCommunicator,
)
from opcore.distributed.groups import (
    DEFAULT_TIMEOUT_S,
    WORLD,
    communicator_class,
    get_communicator,
    group_names,
    init_distributed,
    register_group,
    shutdown,
    unregister_group,
)
from opcore.distributed.launch import RankOutcome, RanksFailed, check, free_port, run_ranks

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "WORLD",
    "CollectiveError",
    "CollectiveTimeout",
    "Communicator",
    "RankOutcome",
    "RanksFailed",
    "TorchCommunicator",
    "check",
    "communicator_class",
    "free_port",
    "get_communicator",
    "group_names",
    "init_distributed",
    "register_group",
    "run_ranks",
    "shutdown",
    "unregister_group",
]
