"""`Communicator`: the collectives opcore's collective ops and tensor-parallel layers use.

A communicator wraps one ``torch.distributed`` process group and the device its tensors
live on. The default implementation, `TorchCommunicator`, calls ``torch.distributed`` with
the group's backend (the platform's ``dist_backend``). A platform supplies its own class
through ``Platform.get_device_communicator_cls()`` (a dotted path to a `Communicator`
subclass), for example one with a one-shot all-reduce for small messages, and declares
with ``capture_safe`` whether its collectives may be captured into a device graph.

Contract of every implementation:

- ``all_reduce(x)``: the element-wise sum of ``x`` over the group's ranks, as a new tensor
  of ``x``'s shape and dtype; ``x`` is not modified. Every rank receives bitwise the same
  result. ``all_reduce_(x)``: the same sum written into ``x``.
- ``all_gather(x, dim)``: the ranks' tensors concatenated along ``dim`` in rank order.
- ``reduce_scatter(x, dim)``: the sum over ranks, split into ``world_size`` equal chunks
  along ``dim``; rank ``r`` receives chunk ``r``.
- ``broadcast(x, src)``: ``x`` of group rank ``src``, on every rank (a new tensor).
- ``barrier()``: returns once every rank has entered it.
- No wait is unbounded: a host wait takes at most ``timeout_s`` and then raises
  `CollectiveTimeout`; work a device waits on is bounded by the same ``timeout_s``, given
  to the process group when it was created (the backend aborts it after that time).
"""

from __future__ import annotations

import abc
import datetime
from typing import Any, ClassVar

import torch
import torch.distributed as dist

# Newer torch renamed the tensor forms of all-gather and reduce-scatter (the old names warn);
# the H200 machines run an older torch that has only the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class CollectiveError(RuntimeError):
    """A collective failed: a peer is gone, the group was torn down, or a wait ran out
    of time. The message names the group, the rank and the collective."""


class CollectiveTimeout(CollectiveError):
    """A wait on a collective ran past the communicator's ``timeout_s``."""


class Communicator(abc.ABC):
    """Collectives over one process group, on one device.

    Args:
        group: the ``torch.distributed`` process group (``None``: the default group).
        device: the device this rank's tensors live on.
        timeout_s: the bound on every wait, in seconds (see the module docstring).
        name: the name the group is registered under (`opcore.distributed.register_group`),
            used in messages.

    Class attributes:
        capture_safe: the collectives (``all_reduce``, ``all_gather``, ``reduce_scatter``,
            ``broadcast``; never ``barrier``, which waits on the host) can be captured by
            ``Platform.capture_graph`` and replayed. Default ``False``; a platform's class
            declares ``True`` only for a backend whose collectives enqueue device work
            without a host wait, and the conformance suite checks the claim.
    """

    capture_safe: ClassVar[bool] = False

    def __init__(
        self,
        group: Any,
        device: torch.device,
        *,
        timeout_s: float,
        name: str = "world",
    ):
        if not (isinstance(timeout_s, int | float) and 0 < timeout_s < float("inf")):
            raise ValueError(
                f"Communicator {name!r}: timeout_s must be a positive finite number of "
                f"seconds, got {timeout_s!r}"
            )
        self.group = group
        self.device = torch.device(device)
        self.timeout_s = float(timeout_s)
        self.name = name
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, rank={self.rank}, "
            f"world_size={self.world_size}, device={self.device}, "
            f"capture_safe={self.capture_safe})"
        )

    @abc.abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over the ranks (a new tensor; ``x`` unchanged)."""

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        """In place: ``x`` becomes the sum over the ranks; returns the result (``x``
        itself where the implementation can write into it). The default copies the result
        of `all_reduce` into ``x``; implementations override it to save the copy."""
        return x.copy_(self.all_reduce(x))

    @abc.abstractmethod
    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """The ranks' ``x`` concatenated along ``dim``, in rank order."""

    @abc.abstractmethod
    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Chunk ``rank`` (along ``dim``) of the sum of ``x`` over the ranks."""

    @abc.abstractmethod
    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Group rank ``src``'s ``x`` on every rank (a new tensor)."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank has entered the barrier (host wait, bounded)."""


class TorchCommunicator(Communicator):
    """The default communicator: ``torch.distributed`` on the group's backend.

    Each collective is issued asynchronously and then waited for: on the host, with the
    ``timeout_s`` bound, when the tensor lives on the CPU (the backend computes it on host
    threads); otherwise the wait only orders the current device stream after the
    collective, so the host never blocks (which keeps the collectives capturable), and the
    process group's own timeout bounds the device-side wait.
    """

    def _wait(self, work: Any, what: str, x: torch.Tensor) -> None:
        try:
            if x.device.type == "cpu":
                self._host_wait(work)
            else:
                work.wait()
        except Exception as exc:  # the backends raise several types; one clear message
            raise _failure(self, what, exc) from exc

    def _host_wait(self, work: Any) -> None:
        # Some backends raise when the time is up, others return False: both end here.
        if work.wait(datetime.timedelta(seconds=self.timeout_s)) is False:
            raise TimeoutError(f"the work did not complete within {self.timeout_s:g} s")

    def _issue(self, what: str, call: Any) -> Any:
        try:
            return call()
        except Exception as exc:
            raise _failure(self, what, exc) from exc

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        out = x.contiguous().clone()
        work = self._issue(
            "all_reduce",
            lambda: dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group, async_op=True),
        )
        self._wait(work, "all_reduce", out)
        return out

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():  # the backends reduce contiguous buffers only
            return x.copy_(self.all_reduce(x))
        work = self._issue(
            "all_reduce",
            lambda: dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group, async_op=True),
        )
        self._wait(work, "all_reduce", x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        x = x.contiguous()
        out = x.new_empty((self.world_size * x.shape[0], *x.shape[1:]))
        work = self._issue(
            "all_gather",
            lambda: _all_gather_single(out, x, group=self.group, async_op=True),
        )
        self._wait(work, "all_gather", out)
        if dim in (0, -x.ndim):
            return out
        # gathered along dim 0 in rank order; move the rank blocks to ``dim``
        return torch.cat(out.chunk(self.world_size, dim=0), dim=dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        if x.shape[dim] % self.world_size:
            raise ValueError(
                f"reduce_scatter over group {self.name!r}: dim {dim} of x has size "
                f"{x.shape[dim]}, not a multiple of the world size {self.world_size}"
            )
        src = x.movedim(dim, 0).contiguous()
        out = src.new_empty((src.shape[0] // self.world_size, *src.shape[1:]))
        work = self._issue(
            "reduce_scatter",
            lambda: _reduce_scatter_single(
                out, src, op=dist.ReduceOp.SUM, group=self.group, async_op=True
            ),
        )
        self._wait(work, "reduce_scatter", out)
        return out.movedim(0, dim).contiguous()

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        if not 0 <= src < self.world_size:
            raise ValueError(
                f"broadcast over group {self.name!r}: src {src} is not a rank of the group "
                f"(world size {self.world_size})"
            )
        out = x.contiguous().clone()
        global_src = dist.get_global_rank(self.group, src) if self.group is not None else src
        work = self._issue(
            "broadcast",
            lambda: dist.broadcast(out, src=global_src, group=self.group, async_op=True),
        )
        self._wait(work, "broadcast", out)
        return out

    def barrier(self) -> None:
        # An all-reduce of one element, waited for on the host with the bound: the same
        # on every backend (the backends' own barriers differ in how they pick a device).
        token = torch.zeros(1, device=self.device)
        work = self._issue(
            "barrier",
            lambda: dist.all_reduce(token, group=self.group, async_op=True),
        )
        try:
            self._host_wait(work)
        except Exception as exc:
            raise _failure(self, "barrier", exc) from exc


def _failure(comm: Communicator, what: str, exc: BaseException) -> CollectiveError:
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    timed_out = "timeout" in text.lower() or "timed out" in text.lower()
    kind = CollectiveTimeout if timed_out else CollectiveError
    reason = f"no answer within {comm.timeout_s:g} s" if timed_out else "it failed"
    return kind(
        f"{what} over group {comm.name!r} (rank {comm.rank} of {comm.world_size}, "
        f"{type(comm).__name__}) {reason}: {first}. A peer rank may have exited or "
        f"stopped answering; the group cannot be used any more."
    )
