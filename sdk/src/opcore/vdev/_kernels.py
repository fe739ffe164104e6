"""The virtual device's aten kernels: one boxed fallback for the PrivateUse1 key.

Every aten op that reaches the PrivateUse1 key (torch's CompositeExplicitAutograd
kernels, views and ``_to_copy`` among them, run before this and decompose into the ops
below) lands in `VirtualKernels.__call__`, which

1. refuses an op that is not in `SUPPORTED_OPS` with a one-line ``NotImplementedError``
   naming the op and the device (what a backend without that kernel says);
2. refuses a floating dtype the device does not compute (`VirtualDevice.dtypes`), and
   device tensors of two different device indices, or a CPU tensor with elements next to
   device tensors outside the copy ops, like a real accelerator;
3. runs the op with torch's CPU kernel on host views of the device tensors (the same
   bytes: in-place ops and ``out=`` write device memory directly);
4. returns device tensors: the argument itself for an in-place or ``out=`` result, a
   device view over the same storage for a view result, and the CPU result's storage
   adopted as device memory (no copy) for a fresh result.

``resize_`` and ``set_`` change the device tensor itself and have their own kernels.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from opcore.vdev._memory import _CPU_KEYS, restride

if TYPE_CHECKING:
    from opcore.vdev._device import VirtualDevice

# Data movement: any dtype the device holds; a CPU tensor may take part (copies).
_COPY_OPS = frozenset({"aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize"})

# The aten operator packets (every overload) the virtual device has kernels for. Chosen
# as what opcore's native op functions, its attention backends, its layers and the
# conformance suite run, plus the elementary ops around them; everything else raises.
SUPPORTED_OPS = frozenset(
    {
        # memory, layout, copies
        "aten::empty",
        "aten::empty_strided",
        "aten::as_strided",
        "aten::view",
        "aten::_reshape_alias",
        "aten::copy_",
        "aten::_copy_from",
        "aten::_copy_from_and_resize",
        "aten::clone",
        "aten::_to_copy",
        "aten::resize_",
        "aten::set_",
        "aten::fill_",
        "aten::zero_",
        "aten::_local_scalar_dense",
        "aten::lift_fresh",
        "aten::alias",
        "aten::detach",
        "aten::unfold",
        "aten::view_as_real",
        "aten::view_as_complex",
        "aten::_unsafe_view",
        "aten::contiguous",
        "aten::is_pinned",
        # creation
        "aten::zeros",
        "aten::ones",
        "aten::full",
        "aten::arange",
        "aten::eye",
        "aten::scalar_tensor",
        "aten::zeros_like",
        "aten::ones_like",
        "aten::full_like",
        "aten::empty_like",
        "aten::linspace",
        "aten::tril",
        "aten::triu",
        # pointwise arithmetic
        "aten::add",
        "aten::sub",
        "aten::mul",
        "aten::div",
        "aten::neg",
        "aten::abs",
        "aten::rsub",
        "aten::pow",
        "aten::sqrt",
        "aten::rsqrt",
        "aten::reciprocal",
        "aten::exp",
        "aten::exp2",
        "aten::log",
        "aten::log2",
        "aten::log1p",
        "aten::expm1",
        "aten::sin",
        "aten::cos",
        "aten::tanh",
        "aten::sigmoid",
        "aten::erf",
        "aten::silu",
        "aten::gelu",
        "aten::relu",
        "aten::clamp",
        "aten::clamp_min",
        "aten::clamp_max",
        "aten::maximum",
        "aten::minimum",
        "aten::where",
        "aten::lerp",
        "aten::addcmul",
        "aten::addcdiv",
        "aten::floor",
        "aten::ceil",
        "aten::round",
        "aten::trunc",
        "aten::sign",
        "aten::remainder",
        "aten::fmod",
        "aten::floor_divide",
        "aten::masked_fill",
        "aten::nan_to_num",
        "aten::frexp",
        "aten::ldexp",
        "aten::hypot",
        "aten::atan2",
        "aten::isneginf",
        "aten::isposinf",
        # comparison and logic
        "aten::eq",
        "aten::ne",
        "aten::lt",
        "aten::le",
        "aten::gt",
        "aten::ge",
        "aten::isnan",
        "aten::isinf",
        "aten::isfinite",
        "aten::logical_and",
        "aten::logical_or",
        "aten::logical_not",
        "aten::logical_xor",
        "aten::bitwise_and",
        "aten::bitwise_or",
        "aten::bitwise_not",
        "aten::bitwise_xor",
        "aten::equal",
        "aten::allclose",
        "aten::isclose",
        "aten::signbit",
        # reductions
        "aten::sum",
        "aten::mean",
        "aten::amax",
        "aten::amin",
        "aten::max",
        "aten::min",
        "aten::aminmax",
        "aten::argmax",
        "aten::argmin",
        "aten::prod",
        "aten::any",
        "aten::all",
        "aten::var",
        "aten::std",
        "aten::var_mean",
        "aten::norm",
        "aten::linalg_vector_norm",
        "aten::cumsum",
        "aten::logsumexp",
        "aten::count_nonzero",
        "aten::_softmax",
        "aten::_log_softmax",
        "aten::softmax",
        "aten::kthvalue",
        # sorting and counting (the MoE routers and fused_experts' native functions)
        "aten::sort",
        "aten::argsort",
        "aten::topk",
        "aten::bincount",
        # shape and data movement within the device
        "aten::cat",
        "aten::stack",
        "aten::expand",
        "aten::repeat",
        "aten::flip",
        "aten::roll",
        "aten::index",
        "aten::index_select",
        "aten::index_put",
        "aten::index_put_",
        "aten::_index_put_impl_",
        "aten::index_copy",
        "aten::index_copy_",
        "aten::index_add",
        "aten::gather",
        "aten::scatter",
        "aten::scatter_add",
        "aten::masked_select",
        "aten::nonzero",
        "aten::select_scatter",
        "aten::slice_scatter",
        "aten::constant_pad_nd",
        "aten::repeat_interleave",
        "aten::unbind",
        "aten::split",
        "aten::split_with_sizes",
        "aten::chunk",
        "aten::bucketize",
        "aten::searchsorted",
        # matrix products
        "aten::mm",
        "aten::bmm",
        "aten::addmm",
        "aten::baddbmm",
        "aten::matmul",
        "aten::dot",
        # scaled dot-product attention's math path
        "aten::_scaled_dot_product_attention_math",
        # random numbers, from the host's default generator (the device has none of its own)
        "aten::normal",
        "aten::uniform",
        "aten::random",
        "aten::bernoulli",
        "aten::exponential",
        "aten::randperm",
    }
)


def is_supported(packet: str) -> bool:
    """Whether aten operator ``packet`` (``"aten::add_"``) has a kernel here; an in-place
    variant is supported with its out-of-place op."""
    return packet in SUPPORTED_OPS or (packet.endswith("_") and packet[:-1] in SUPPORTED_OPS)


class UnsupportedOpError(NotImplementedError):
    """An aten op the virtual device has no kernel for."""


# An aten op's arguments are flat: a value, or a list of values (Tensor[], Tensor?[]). These
# two walk exactly that, much cheaper than a general pytree on every call.
def _map(fn, value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(fn(v) for v in value)
    return fn(value)


def _leaves(args: tuple, kwargs: dict) -> Iterator[Any]:
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


def _numbers_as_tensors(op, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Python numbers back into tensors where the schema takes a ``Tensor``: torch hands
    a boxed fallback its wrapped-number arguments (``t % 16``) as plain numbers, which the
    CPU overload would then refuse."""
    params = op._schema.arguments

    def fix(param, value):
        if isinstance(value, (bool, int, float, complex)) and isinstance(
            param.type, torch._C.TensorType
        ):
            return torch.tensor(value)
        return value

    args = tuple(fix(p, v) for p, v in zip(params, args, strict=False)) + tuple(args[len(params) :])
    by_name = {p.name: p for p in params}
    kwargs = {k: (fix(by_name[k], v) if k in by_name else v) for k, v in kwargs.items()}
    return args, kwargs


def _keyword_device(args: tuple, kwargs: dict, device_type: str) -> torch.device | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.device) and value.type == device_type:
            return value
    return None


class VirtualKernels:
    """The PrivateUse1 fallback of one installed virtual device (see the module doc)."""

    def __init__(self, device: VirtualDevice) -> None:
        self.device = device

    # ------------------------------------------------------------------ entry
    def __call__(self, op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
        name = op.name()
        packet = op._schema.name
        counts = self.device.op_counts
        counts[name] = counts.get(name, 0) + 1
        if not is_supported(packet):
            raise UnsupportedOpError(
                f"{name} is not supported by the virtual device {self.device.device_type!r} "
                f"(opcore.vdev has no kernel for it; its README lists what it runs)"
            )
        if packet == "aten::resize_":
            return self.resize_(*args, **kwargs)
        if packet == "aten::set_":
            return self.set_(op, *args, **kwargs)
        if packet in ("aten::_copy_from", "aten::_copy_from_and_resize"):
            return self.copy_from(name, packet, *args, **kwargs)
        return self._host_call(op, name, packet, args, kwargs)

    # ------------------------------------------------------------------ generic path
    def _host_call(self, op, name: str, packet: str, args: tuple, kwargs: dict) -> Any:
        dev = self.device
        dtype_kw = kwargs.get("dtype")
        if isinstance(dtype_kw, torch.dtype):
            dev.check_dtype(dtype_kw, name)
        index = self._index_of(name, packet, args, kwargs)
        host_of: dict[int, torch.Tensor] = {}  # host storage ptr -> a device tensor on it

        def to_host(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.device.type == dev.device_type:
                h = dev.memory.host_view(x)
                host_of.setdefault(h.untyped_storage().data_ptr(), x)
                return h
            if isinstance(x, torch.device) and x.type == dev.device_type:
                return torch.device("cpu")
            return x

        args, kwargs = _numbers_as_tensors(op, args, kwargs)
        h_args = tuple(_map(to_host, a) for a in args)
        h_kwargs = {k: _map(to_host, v) for k, v in kwargs.items()}
        h_storages = {
            id(x): x.untyped_storage().data_ptr()
            for x in _leaves(h_args, h_kwargs)
            if isinstance(x, torch.Tensor)
        }
        result = op(*h_args, **h_kwargs)
        return self._results(
            op, name, index, args, kwargs, h_args, h_kwargs, h_storages, host_of, result
        )

    def _index_of(self, name: str, packet: str, args: tuple, kwargs: dict) -> int:
        """The device index the op runs on: its device tensors' (all one index), else its
        ``device=`` argument's, else the current device."""
        dev = self.device
        found: torch.device | None = None
        for x in _leaves(args, kwargs):
            if not isinstance(x, torch.Tensor):
                continue
            if x.device.type == dev.device_type:
                if x.dtype.is_floating_point or x.dtype.is_complex:
                    dev.check_dtype(x.dtype, name)
                if packet in _COPY_OPS:
                    found = found or x.device
                elif found is None:
                    found = x.device
                elif x.device != found:
                    raise RuntimeError(
                        f"{name}: expected all tensors to be on the same device, but found at "
                        f"least two devices, {found} and {x.device}"
                    )
            elif x.device.type == "cpu" and x.dim() > 0 and packet not in _COPY_OPS:
                raise RuntimeError(
                    f"{name}: expected all tensors to be on {dev.device_type}, but found a cpu "
                    f"tensor of shape {tuple(x.shape)} (only 0-dim cpu tensors may join device "
                    "tensors)"
                )
        if found is None:
            found = _keyword_device(args, kwargs, dev.device_type)
        index = dev.current_index if found is None or found.index is None else found.index
        dev.check_index(index, name)
        return index

    def _results(
        self, op, name, index, args, kwargs, h_args, h_kwargs, h_storages, host_of, result
    ):
        dev = self.device
        schema = op._schema
        # alias set -> (original argument, its host view) for written arguments
        written: dict[str, tuple[Any, Any]] = {}
        positional = len(args)
        for i, arg in enumerate(schema.arguments):
            info = arg.alias_info
            if info is None or not info.is_write:
                continue
            if i < positional:
                orig, host = args[i], h_args[i]
            elif arg.name in kwargs:
                orig, host = kwargs[arg.name], h_kwargs[arg.name]
            else:
                continue
            for alias_set in info.before_set:
                written[alias_set] = (orig, host)

        def wrap(x: Any, ret_info) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            if ret_info is not None and ret_info.is_write:
                for alias_set in ret_info.before_set:
                    if alias_set in written:
                        orig, host = written[alias_set]
                        if isinstance(orig, torch.Tensor) and orig.device.type == dev.device_type:
                            self._sync_resized(name, orig, host, h_storages)
                        return orig
            ptr = x.untyped_storage().data_ptr()
            base = host_of.get(ptr)
            if base is not None:  # a view of (or the same memory as) a device argument
                return restride(base, x.dtype, x.shape, x.stride(), x.storage_offset())
            if x.device.type != "cpu":
                return x
            if x.dtype.is_floating_point or x.dtype.is_complex:
                dev.check_dtype(x.dtype, name)  # a result the device could not hold
            fresh = dev.memory.adopt(x.untyped_storage(), index)
            return restride(fresh, x.dtype, x.shape, x.stride(), x.storage_offset())

        returns = schema.returns
        if len(returns) == 1:
            info = returns[0].alias_info
            if isinstance(result, (list, tuple)) and not isinstance(result, torch.Tensor):
                return type(result)(wrap(r, info) for r in result)
            return wrap(result, info)
        return tuple(wrap(r, ret.alias_info) for r, ret in zip(result, returns, strict=True))

    def _sync_resized(
        self, name: str, orig: torch.Tensor, host: torch.Tensor, h_storages: dict
    ) -> None:
        """An ``out=`` argument the CPU kernel resized (new host storage): resize the
        device tensor the same way and copy the result into it."""
        if (
            host.untyped_storage().data_ptr() == h_storages.get(id(host))
            and host.shape == orig.shape
        ):
            return
        result = host
        self.resize_(orig, list(result.shape))
        self.device.memory.host_view(orig).copy_(result)

    # ------------------------------------------------------------------ own kernels
    def resize_(self, t: torch.Tensor, size, memory_format=None) -> torch.Tensor:
        """Resize ``t`` in place (contiguous); new device memory when its storage is too
        small, keeping the bytes it had."""
        dev = self.device
        size = [int(s) for s in size]
        stride, acc = [0] * len(size), 1
        for i in range(len(size) - 1, -1, -1):
            stride[i], acc = acc, acc * max(size[i], 1)
        numel = 1
        for s in size:
            numel *= s
        need = (t.storage_offset() + numel) * t.element_size()
        storage = t.untyped_storage()
        if need > storage.nbytes():
            fresh = dev.memory.allocate(int(need), t.device.index or 0)  # a real tensor's size
            old = dev.memory.host_buffer(t)
            dev.memory.host_view(fresh)[: old.numel()].copy_(old[: storage.nbytes()])
            storage = fresh.untyped_storage()
        return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
            _CPU_KEYS, t, storage, t.storage_offset(), size, stride
        )

    def copy_from(
        self,
        name: str,
        packet: str,
        src: torch.Tensor,
        dst: torch.Tensor,
        non_blocking: bool = False,
    ):
        """``copy_``'s cross-device step (torch's ``copy_`` calls it when either side is
        not a CPU tensor): the host views of both sides, copied by the CPU kernel."""
        self._index_of(name, packet, (src, dst), {})
        if packet == "aten::_copy_from_and_resize" and dst.shape != src.shape:
            if dst.device.type == self.device.device_type:
                self.resize_(dst, list(src.shape))
            else:
                dst.resize_(src.shape)
        self._host(dst).copy_(self._host(src))
        return dst

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        return self.device.memory.host_view(t) if t.device.type == self.device.device_type else t

    def set_(self, op, t: torch.Tensor, source=None, storage_offset=None, size=None, stride=None):
        """``set_`` with another device storage or tensor of the same device; ``set_()``
        (no source) empties ``t``."""
        if source is None:
            fresh = self.device.memory.allocate(0, t.device.index or 0)
            return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
                _CPU_KEYS, t, fresh.untyped_storage(), 0, [0], [1]
            )
        if isinstance(source, torch.Tensor):
            return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
                _CPU_KEYS,
                t,
                source.untyped_storage(),
                source.storage_offset(),
                list(source.shape),
                list(source.stride()),
            )
        if size is None:
            size = [source.nbytes() // t.element_size()]
        if stride is None:
            stride = []
        return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
            _CPU_KEYS, t, source, storage_offset or 0, list(size), list(stride)
        )
