"""Bound launches: a Triton provider's call recorded once, then replayed per call.

Dispatch remembers one callable per call signature (device, dtypes, shapes, strides,
16-byte alignment, the non-tensor values; `opcore.ir.dispatch`). For a signature every
choice a launcher makes (launch configuration, grid, constexprs, the kernel binary Triton
specialises for those dtypes and alignments) is fixed, so only the per-call work is left:
allocate the outputs and launch the compiled kernel with the call's tensors. That is what
`binder` builds, from one recorded run of the provider:

- the provider allocates its outputs with `empty` and launches with `launch`, which record
  what they did while a bind is in progress (and only forward otherwise);
- every tensor a launch received must be an argument of the call, a view of one (the
  pointer is then the argument's plus a fixed offset), or a recorded allocation, and the
  result must be made of arguments and allocations. Anything else (a tensor computed by
  a torch op, a cached buffer, a returned view) cannot be replayed faithfully, and the
  provider's function keeps serving that signature unbound.

A replay launches through the compiled kernel's own launcher (`CompiledKernel.run`, or
the C entry point under it unless the kernel needs profiling scratch; global scratch, which
tensor descriptors made on the device need, comes from torch's allocator), skipping Triton's
Python binder and cache lookup, with the tensors' data pointers. It launches on the
current stream of the device the kernel was bound on (the signature fixes the tensors'
device), and checks per call the one thing the signature does not fix: no launch hook is
installed (a profiler's hooks need Triton's full path, which then runs). Under Triton's
interpreter there is no compiled kernel: a replay calls the interpreted kernel with the
same arguments, so the recording logic runs in CPU tests too.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger("opcore.kernels.triton")

_Tensor = torch.Tensor
_state = threading.local()  # .recording: the `_Recording` of this thread's bind, or None


class _Recording:
    __slots__ = ("allocs", "launches")

    def __init__(self) -> None:
        self.allocs: list[torch.Tensor] = []
        self.launches: list[tuple[Any, tuple, tuple, dict, Any]] = []


def empty(shape: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``, recorded during a bind: how a
    provider allocates the outputs its kernels write."""
    t = torch.empty(shape, dtype=dtype, device=device)
    rec = getattr(_state, "recording", None)
    if rec is not None:
        rec.allocs.append(t)
    return t


def launch(
    kernel: Any, grid: tuple, *args: Any, scratch_device: Any = None, **options: Any
) -> None:
    """``kernel[grid](*args, **options)``, recorded during a bind. ``scratch_device``: for
    a kernel that asks for global scratch memory at launch (tensor descriptors made on the
    device do), the `torch.device` whose caching allocator serves it, here and on replay
    (typed ``Any`` so that callers' ``**options`` dicts type-check)."""
    if scratch_device is None:
        compiled = kernel[grid](*args, **options)
    else:
        compiled = _with_torch_scratch(scratch_device, lambda: kernel[grid](*args, **options))
    rec = getattr(_state, "recording", None)
    if rec is not None:
        rec.launches.append((kernel, grid, args, options, compiled))


def _with_torch_scratch(device: torch.device, fn: Callable[[], Any]) -> Any:
    """``fn()`` with Triton's scratch allocator set to torch's on ``device``, in a copy of
    the caller's context (an allocator the caller set stays theirs)."""
    import triton

    def scratch(size: int, alignment: int, stream: Any) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8, device=device)

    def run() -> Any:
        triton.set_allocator(scratch)
        return fn()

    return contextvars.copy_context().run(run)


def binder(fn: Callable[..., Any]) -> Callable[..., tuple[Any, Callable[..., Any] | None]]:
    """The ``bind`` of provider function ``fn`` (`opcore.ir.impl.Impl`): runs ``fn`` once,
    recording its allocations and launches, and returns ``(result, replay or None)``."""

    def bind(*args: Any) -> tuple[Any, Callable[..., Any] | None]:
        rec = _Recording()
        outer = getattr(_state, "recording", None)
        _state.recording = rec
        try:
            result = fn(*args)
        finally:
            _state.recording = outer
        try:
            replay = _replay(fn, rec, args, result)
        except Exception as why:  # the call is computed: an unbindable one stays unbound
            logger.debug("%s: not bound (%s)", getattr(fn, "__qualname__", fn), why)
            replay = None
        return result, replay

    bind.__wrapped__ = fn  # type: ignore[attr-defined]
    return bind


class _Unbindable(Exception):
    pass


# Where a launch argument or a result comes from on replay.
_ARG, _ALLOC, _VIEW = 0, 1, 2
# In a compiled replay's plan, a view's pointer is its base's plus a byte offset.
_VIEW_ARG, _VIEW_ALLOC = 3, 4


def _source(t: torch.Tensor, args: tuple, allocs: list[torch.Tensor]) -> tuple:
    """Where ``t`` comes from on replay: ``(_ARG, i)``, ``(_ALLOC, k)``, or ``(_VIEW,
    kind, index, byte offset, shape, stride, dtype)`` for a view (any dtype) of argument
    or allocation ``index``: the same offset from it on every call of this signature."""
    for i, a in enumerate(args):
        if a is t:
            return (_ARG, i)
    for k, a in enumerate(allocs):
        if a is t:
            return (_ALLOC, k)
    storage = t.untyped_storage().data_ptr()
    for kind, pool in ((_ARG, args), (_ALLOC, allocs)):
        for i, a in enumerate(pool):
            if (
                isinstance(a, _Tensor)
                and a.device == t.device
                and a.untyped_storage().data_ptr() == storage
            ):
                src = (_VIEW, kind, i, t.data_ptr() - a.data_ptr(), tuple(t.shape), t.stride(),
                       t.dtype)  # fmt: skip
                rebuilt = _view_of(a, src)
                if (
                    rebuilt.data_ptr() != t.data_ptr()
                    or rebuilt.shape != t.shape
                    or rebuilt.stride() != t.stride()
                ):
                    raise _Unbindable("a view that as_strided cannot rebuild")
                return src
    raise _Unbindable(f"a tensor of shape {tuple(t.shape)} is neither an argument nor allocated")


def _view_of(base: torch.Tensor, src: tuple) -> torch.Tensor:
    """The view ``src`` describes, rebuilt over ``base`` (for the interpreter's replay)."""
    _, _, _, offset, shape, stride, dtype = src
    if base.dtype != dtype:
        base = base.view(dtype)
    return torch.as_strided(base, shape, stride, base.storage_offset() + offset // base.itemsize)


def _result_plan(result: Any, args: tuple, allocs: list[torch.Tensor]) -> Any:
    """How to rebuild ``result``: None, ``(_ARG, i)`` / ``(_ALLOC, k)``, or a tuple."""
    if result is None:
        return None
    if isinstance(result, _Tensor):
        src = _source(result, args, allocs)
        if src[0] == _VIEW:
            raise _Unbindable("the result is a view")
        return src
    if isinstance(result, tuple):
        return tuple(_result_plan(r, args, allocs) for r in result)
    raise _Unbindable(f"the result is a {type(result).__name__}")


def _build(plan: Any, args: tuple, outs: list) -> Any:
    if plan is None:
        return None
    if isinstance(plan[0], int):
        return args[plan[1]] if plan[0] == _ARG else outs[plan[1]]
    return tuple(_build(p, args, outs) for p in plan)


def _full_arguments(kernel: Any, args: tuple, options: dict) -> list:
    """The values of every kernel parameter in order (constexprs and defaults included):
    what `CompiledKernel.run` takes after the launch metadata."""
    names = kernel.arg_names
    values = list(args)
    for p in kernel.params[len(args) :]:
        if p.name in options:
            values.append(options[p.name])
        elif p._param.default is not p._param.empty:
            values.append(p._param.default)
        else:
            raise _Unbindable(f"kernel parameter {p.name!r} has no value")
    if len(values) != len(names):
        raise _Unbindable("kernel arguments do not match its parameters")
    return values


def _replay(fn: Callable, rec: _Recording, args: tuple, result: Any) -> Callable[..., Any]:
    allocs = rec.allocs
    specs = [(tuple(t.shape), t.stride(), t.dtype, t.device) for t in allocs]
    plan = _result_plan(result, args, allocs)
    # Under the interpreter there is no compiled kernel; with no launch at all (empty
    # inputs) there is nothing to launch either: both replay through the kernels' call.
    interpreted = not rec.launches or any(c is None for *_, c in rec.launches)
    steps: list[Any] = []  # per launch: the interpreter's form, or the compiled one
    for kernel, grid, kargs, options, compiled in rec.launches:
        if interpreted:
            # Replayed through the interpreter: real tensors (views rebuilt with as_strided).
            subs, template = [], list(kargs)
            for pos, v in enumerate(kargs):
                if isinstance(v, _Tensor):
                    subs.append((pos, _source(v, args, allocs)))
                    template[pos] = None  # the template holds no tensor of the first call
            steps.append((kernel, grid, template, options, subs))
            continue
        values = _full_arguments(kernel, kargs, options)
        subs = []
        for pos, v in enumerate(values):
            if isinstance(v, _Tensor):
                subs.append((pos, _source(v, args, allocs)))
        g = tuple(grid) + (1, 1)
        steps.append(
            (
                compiled.run,
                g[0],
                g[1],
                g[2],
                compiled.function,
                compiled.packed_metadata,
                values,
                subs,
            )
        )
    if interpreted:
        return _interpreted_replay(fn, specs, steps, plan)
    return _compiled_replay(fn, specs, steps, plan, args)


def _interpreted_replay(fn: Callable, specs: list, steps: list, plan: Any) -> Callable[..., Any]:
    def replay(*args: Any) -> Any:
        outs = [torch.empty_strided(s, st, dtype=dt, device=dev) for s, st, dt, dev in specs]
        for kernel, grid, template, options, subs in steps:
            values = list(template)
            for pos, src in subs:
                kind = src[0]
                if kind == _ARG:
                    values[pos] = args[src[1]]
                elif kind == _ALLOC:
                    values[pos] = outs[src[1]]
                else:
                    base = args[src[2]] if src[1] == _ARG else outs[src[2]]
                    values[pos] = _view_of(base, src)
            kernel[grid](*values, **options)
        return _build(plan, args, outs)

    replay.__wrapped__ = fn  # type: ignore[attr-defined]
    return replay


def _allocator(spec: tuple, args: tuple) -> Callable[[tuple], torch.Tensor]:
    """``alloc(args)`` making one output: ``torch.empty_like`` of an argument whose shape,
    strides, dtype and device it shares (cheaper than ``empty_strided``), else
    ``empty_strided``."""
    shape, stride, dtype, device = spec
    for i, a in enumerate(args):
        if (
            isinstance(a, _Tensor)
            and a.is_contiguous()
            and tuple(a.shape) == shape
            and a.stride() == stride
            and a.dtype == dtype
            and a.device == device
        ):
            empty_like = torch.empty_like
            return lambda args: empty_like(args[i])
    empty_strided = torch.empty_strided
    return lambda args: empty_strided(shape, stride, dtype=dtype, device=device)


def _direct_launch(launcher: Any, device: torch.device) -> Callable[..., None] | None:
    """The C entry point under Triton's launcher object, with the launcher's own fixed
    arguments bound, when the kernel needs no profiling scratch memory; global scratch
    (``grid size x CTAs x the kernel's size`` bytes, per launch) comes from torch's caching
    allocator on ``device``, stream-ordered like the launch. Else None."""
    launch = getattr(launcher, "launch", None)
    if launch is None or not all(
        hasattr(launcher, a)
        for a in ("launch_cooperative_grid", "launch_pdl", "global_scratch_size")
    ):
        return None
    if getattr(launcher, "profile_scratch_size", 1):
        return None
    coop, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
    scratch = launcher.global_scratch_size * getattr(launcher, "num_ctas", 1)
    if not scratch:

        def direct(gx, gy, gz, stream, function, meta, *values):
            launch(gx, gy, gz, stream, function, coop, pdl, None, None, meta, None, None, None,
                   *values)  # fmt: skip

        return direct
    empty, int8 = torch.empty, torch.int8

    def direct_with_scratch(gx, gy, gz, stream, function, meta, *values):
        buf = empty(gx * gy * gz * scratch, dtype=int8, device=device)
        launch(gx, gy, gz, stream, function, coop, pdl, buf, None, meta, None, None, None,
               *values)  # fmt: skip

    return direct_with_scratch


def _compiled_replay(
    fn: Callable, specs: list, steps: list, plan: Any, args: tuple
) -> Callable[..., Any]:
    import triton
    from triton.runtime import driver

    bound_device = driver.active.get_current_device()
    torch_device = torch.device(driver.active.get_active_torch_device().type, bound_device)
    stream_of = driver.active.get_current_stream
    hooks = triton.knobs.runtime
    allocs = [_allocator(spec, args) for spec in specs]
    # Per launch: (launch, gx, gy, gz, function, metadata, template, [(position, kind,
    # index, byte offset)]). Tensors are passed as data pointers (what the launcher would
    # read from them); the template holds nothing of the first call.
    flat = []
    for run, gx, gy, gz, function, meta, values, subs in steps:
        plan_subs = []
        for pos, src in subs:
            values[pos] = None
            if src[0] == _VIEW:  # its base's pointer plus the recorded byte offset
                kind = _VIEW_ARG if src[1] == _ARG else _VIEW_ALLOC
                plan_subs.append((pos, kind, src[2], src[3]))
            else:
                plan_subs.append((pos, src[0], src[1], 0))
        launch = _direct_launch(run, torch_device)
        needs_scratch = bool(getattr(run, "global_scratch_size", 0))
        if launch is None and needs_scratch:

            def launch(gx, gy, gz, stream, function, meta, *values, _run=run):
                _with_torch_scratch(
                    torch_device,
                    lambda: _run(gx, gy, gz, stream, function, meta, None, None, None, *values),
                )

        elif launch is None:

            def launch(gx, gy, gz, stream, function, meta, *values, _run=run):
                _run(gx, gy, gz, stream, function, meta, None, None, None, *values)

        flat.append((launch, gx, gy, gz, function, meta, values, plan_subs))

    def replay(*args: Any) -> Any:
        if hooks.launch_enter_hook.calls or hooks.launch_exit_hook.calls:
            return fn(*args)  # a profiler's launch hooks need Triton's own path
        outs = [alloc(args) for alloc in allocs]
        stream = stream_of(bound_device)
        for launch, gx, gy, gz, function, meta, template, subs in flat:
            values = template.copy()
            for pos, kind, i, offset in subs:
                if kind == _ARG:
                    values[pos] = args[i].data_ptr()
                elif kind == _ALLOC:
                    values[pos] = outs[i].data_ptr()
                elif kind == _VIEW_ARG:
                    values[pos] = args[i].data_ptr() + offset
                else:
                    values[pos] = outs[i].data_ptr() + offset
            launch(gx, gy, gz, stream, function, meta, *values)
        return _build(plan, args, outs)

    replay.__wrapped__ = fn  # type: ignore[attr-defined]
    return replay
