"""What `opcore bench` records about the run besides timings: the host's cores, the torch
thread count (pinned on the host CPU), the load average, the installed plugin
distributions and the identity hash of every provider it times.

A timing means little without these: on a host CPU an op timed with OpenMP threads
fighting other processes can read hundreds of times slower than with one thread, and a
provider's number belongs to the source it was measured with (`IrOp.identity_hash`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
from collections.abc import Iterable, Iterator

import torch

# The default torch thread count on the host CPU is min(physical cores available to this
# process, DEFAULT_MAX_THREADS): one thread per core (SMT siblings share the core's
# vector units), and few enough that OpenMP's fork-join cost does not swamp small ops.
DEFAULT_MAX_THREADS = 8


def available_logical_cpus() -> int:
    """Logical CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def physical_cores() -> int | None:
    """Physical cores among the CPUs this process may run on, from ``/proc/cpuinfo``
    (distinct physical id and core id pairs); ``None`` where that file is not there or
    does not say."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    try:
        allowed: set[int] | None = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = None
    cores = set()
    for block in text.split("\n\n"):
        fields = dict(
            (k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in block.splitlines())
        )
        if "processor" not in fields or "core id" not in fields:
            continue
        if allowed is not None and int(fields["processor"]) not in allowed:
            continue
        cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or None


def default_threads() -> int:
    """min(physical cores available (logical CPUs where unknown), `DEFAULT_MAX_THREADS`)."""
    cores = physical_cores() or available_logical_cpus()
    return max(1, min(cores, DEFAULT_MAX_THREADS))


@contextlib.contextmanager
def pinned_threads(n: int) -> Iterator[int]:
    """Run the block with ``torch.set_num_threads(n)``; the previous count is restored on
    the way out, whatever happens inside. Yields the previous count.

    Raises:
        ValueError: ``n`` is not a positive integer.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"thread count must be a positive integer, got {n!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield before
    finally:
        torch.set_num_threads(before)


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``os.getloadavg``), or ``None`` where the OS
    has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def host_cpu() -> str | None:
    """The host CPU's model name from ``/proc/cpuinfo``, or ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or None


def plugin_versions() -> dict[str, str]:
    """``{distribution: version}`` of every installed distribution that declares an entry
    point in one of opcore's plugin groups (`opcore.plugins.ALL_GROUPS`), whatever
    ``OPCORE_PLUGINS`` lets through."""
    from opcore.plugins import ALL_GROUPS

    found: dict[str, str] = {}
    for group in ALL_GROUPS:
        for ep in md.entry_points(group=group):
            dist = getattr(ep, "dist", None)
            if dist is not None:
                found.setdefault(dist.metadata["Name"], dist.version)
    return dict(sorted(found.items()))


def distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None``."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def provider_identities(op_names: Iterable[str]) -> dict[str, dict[str, str]]:
    """``{op: {provider: identity hash}}`` for every provider registered for each of
    ``op_names`` (`IrOp.identity_hash`: a hash of the provider's source); a provider whose
    source cannot be hashed maps to ``"unavailable: <why>"``."""
    from opcore.ir import ops

    out: dict[str, dict[str, str]] = {}
    for name in op_names:
        op = getattr(ops, name)
        ids: dict[str, str] = {}
        for provider in op.impls:
            try:
                ids[provider] = op.identity_hash(provider)
            except Exception as exc:  # one unreadable source must not lose the run
                ids[provider] = f"unavailable: {type(exc).__name__}: {exc}"
        out[name] = ids
    return out
