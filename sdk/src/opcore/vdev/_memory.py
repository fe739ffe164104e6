"""Device memory of the virtual device: host buffers lent to PrivateUse1 storages.

A virtual-device tensor is an ordinary torch tensor on the renamed PrivateUse1 device
whose storage points at a host buffer (a CPU ``uint8`` tensor) held by this module. Its
sizes, strides, storage offset and storage sharing are the tensor's own, exactly as on a
real accelerator; `host_view` gives the CPU tensor with the same layout over the same
bytes, which is how the kernels compute and how copies to and from ``cpu`` move data.

How a storage on device ``i`` is made without C++: torch maps DLPack's "extension device"
(``kDLExtDev``) to PrivateUse1, so a DLPack capsule of the host buffer, with its device
field set to ``(kDLExtDev, i)``, imports as a PrivateUse1 tensor on device ``i`` over the
same memory. The capsule's deleter releases the host buffer when torch frees the storage,
which is also when this module stops counting its bytes against the device's memory.
Views are made by torch's own CPU view kernels (``as_strided``, ``set_``), which keep the
storage and the dispatch keys of the tensor they are called on.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import weakref

import torch

_DL_EXT_DEV = 12  # DLPack's kDLExtDev: the device type torch imports as PrivateUse1
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _Block:
    """One allocation: the host buffer (weakly: the storage owns it), device, size."""

    __slots__ = ("buffer", "index", "nbytes")

    def __init__(self, buffer: weakref.ref, index: int, nbytes: int) -> None:
        self.buffer = buffer
        self.index = index
        self.nbytes = nbytes


class Memory:
    """The allocations of every device of one installed virtual device.

    ``capacity`` is each device's memory in bytes (``None``: unbounded). Allocation past
    it raises ``torch.OutOfMemoryError`` naming the device, the request and the use.

    Frees are queued, not counted where they happen. A device storage dies wherever its
    last reference goes, which includes a garbage collection run inside this class's own
    locked code (any allocation of a Python object there may start one); a weakref callback
    that took ``_lock`` would then wait on its own thread forever. So the callback only
    puts the block on ``_freed`` (a `queue.SimpleQueue`, whose ``put`` is documented
    reentrant: safe from weakref callbacks and ``__del__``) and every locked operation,
    the statistics included, settles the queue first.
    """

    def __init__(self, device_type: str, devices: int, capacity: int | None) -> None:
        self.device_type = device_type
        self.capacity = capacity
        self._used = [0] * devices
        self._peak = [0] * devices
        self._blocks: dict[int, _Block] = {}
        self._freed: queue.SimpleQueue[tuple[int, weakref.ref]] = queue.SimpleQueue()
        self._lock = threading.Lock()  # never taken by a callback: see the class doc

    # ------------------------------------------------------------------ statistics
    @property
    def used(self) -> list[int]:
        """Bytes in use on each device (a copy, with every free so far counted)."""
        with self._lock:
            self._settle()
            return list(self._used)

    @property
    def peak(self) -> list[int]:
        """The most bytes in use on each device since the start or the last reset."""
        with self._lock:
            self._settle()
            return list(self._peak)

    def reset_peak(self, index: int) -> None:
        with self._lock:
            self._settle()
            self._peak[index] = self._used[index]

    # ------------------------------------------------------------------ allocation
    def allocate(self, nbytes: int, index: int) -> torch.Tensor:
        """A fresh 1-D ``uint8`` device tensor of ``nbytes`` bytes on device ``index``."""
        self._reserve(nbytes, index)
        try:
            buffer = torch.empty(max(int(nbytes), 1), dtype=torch.uint8)
        except BaseException:
            self._release(nbytes, index)
            raise
        return self._lend(buffer, index, nbytes)

    def adopt(self, storage: torch.UntypedStorage, index: int) -> torch.Tensor:
        """A 1-D ``uint8`` device tensor over the bytes of a fresh host ``storage`` (a
        kernel's output): the result becomes device memory without a copy."""
        nbytes = storage.nbytes()
        self._reserve(nbytes, index)
        buffer = torch.empty(0, dtype=torch.uint8)
        if nbytes:
            buffer.set_(storage, 0, (nbytes,), (1,))
        else:  # an empty output still needs an address of its own
            buffer = torch.empty(1, dtype=torch.uint8)
        return self._lend(buffer, index, nbytes)

    def _reserve(self, nbytes: int, index: int) -> None:
        with self._lock:
            self._settle()  # memory freed so far counts as free before the capacity check
            used = self._used[index]
            if self.capacity is not None and used + nbytes > self.capacity:
                raise torch.OutOfMemoryError(
                    f"{self.device_type}:{index} out of memory: tried to allocate {nbytes} bytes "
                    f"with {used} of {self.capacity} bytes in use"
                )
            self._used[index] = used + nbytes
            self._peak[index] = max(self._peak[index], self._used[index])

    def _release(self, nbytes: int, index: int) -> None:
        with self._lock:
            self._settle()
            self._used[index] -= nbytes

    def _lend(self, buffer: torch.Tensor, index: int, nbytes: int) -> torch.Tensor:
        key = buffer.data_ptr()
        freed_queue = self._freed

        def freed(ref: weakref.ref, key: int = key) -> None:
            # The device storage died and released the buffer (the capsule's deleter).
            # Runs wherever that happened, possibly inside `_lock`: queue, never lock.
            freed_queue.put((key, ref))

        ref = weakref.ref(buffer, freed)
        with self._lock:
            self._settle()
            stale = self._blocks.get(key)
            if stale is not None:
                # A dead buffer at this address whose free is not queued yet (it can be
                # queued after its memory went back to the allocator): count it now; its
                # queue entry is then ignored by `_forget`.
                self._forget(key, stale.buffer)
            self._blocks[key] = _Block(ref, index, nbytes)
        capsule = torch.utils.dlpack.to_dlpack(buffer)
        # DLManagedTensor starts with DLTensor {void* data; DLDevice {int32 type, int32 id}}
        device = (ctypes.c_int32 * 2).from_address(_capsule_pointer(capsule, b"dltensor") + 8)
        device[0], device[1] = _DL_EXT_DEV, index
        return torch.utils.dlpack.from_dlpack(capsule)

    def _settle(self) -> None:
        """Count the queued frees (``_lock`` held)."""
        while True:
            try:
                key, ref = self._freed.get_nowait()
            except queue.Empty:
                return
            self._forget(key, ref)

    def _forget(self, key: int, ref: weakref.ref) -> None:
        """Drop the block at ``key`` if it is still the one ``ref`` watched (``_lock``
        held): a later allocation may have reused the address before the free was seen."""
        block = self._blocks.get(key)
        if block is not None and block.buffer is ref:
            del self._blocks[key]
            self._used[block.index] -= block.nbytes

    # ------------------------------------------------------------------ access
    def host_buffer(self, t: torch.Tensor) -> torch.Tensor:
        """The host ``uint8`` buffer behind device tensor ``t``'s storage."""
        key = t.untyped_storage().data_ptr()
        block = self._blocks.get(key)
        buffer = block.buffer() if block is not None else None
        if buffer is None:
            raise RuntimeError(
                f"a {t.device} tensor whose storage is not {self.device_type} memory "
                f"(data_ptr {key:#x}): it was not made by the virtual device"
            )
        return buffer

    def host_view(self, t: torch.Tensor) -> torch.Tensor:
        """The CPU tensor with ``t``'s dtype, sizes, strides and storage offset over the
        same bytes: reads and writes go to the device tensor's memory."""
        buffer = self.host_buffer(t)
        return torch.empty(0, dtype=t.dtype).set_(
            buffer.untyped_storage(), t.storage_offset(), t.shape, t.stride()
        )

    def owns(self, storage_ptr: int) -> bool:
        """Whether ``storage_ptr`` is live memory of this device (a freed block may wait
        in the queue until the next locked operation)."""
        block = self._blocks.get(storage_ptr)
        return block is not None and block.buffer() is not None


def restride(
    base: torch.Tensor, dtype: torch.dtype, size, stride, offset: int | torch.SymInt
) -> torch.Tensor:
    """A device tensor over ``base``'s storage (the same storage object, so aliasing is
    visible to torch) with the given dtype and layout; ``offset`` in elements of ``dtype``.
    Made by torch's CPU view kernels, which keep the storage and dispatch keys of ``base``."""
    if dtype != base.dtype:
        empty = torch.ops.aten.as_strided.default.redispatch(_CPU_KEYS, base, [0], [1], 0)
        base = torch.ops.aten.view.dtype.redispatch(_CPU_KEYS, empty, dtype)
    return torch.ops.aten.as_strided.default.redispatch(
        _CPU_KEYS, base, list(size), list(stride), offset
    )
