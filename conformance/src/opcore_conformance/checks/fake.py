"""Checks that run on fake tensors or through the torch library.

``supports_args[op-provider-dtype-sample]``: a provider's ``supports_args`` returns a plain
``bool`` on fake tensors, with static and with symbolic sizes and strides (it must decide
from metadata: it runs while compiling, with dynamic shapes too), and the same answer as on
the real device tensors. One that reads tensor values raises on fake
tensors and fails. Providers without ``supports_args`` take every argument and get one
``not_applicable`` case.

``opcheck[op-provider-dtype-sample]``: ``torch.library.opcheck`` on ``torch.ops.opcore_ir.<op>``
(and its ``maybe_inplace`` overload for ops that have one) with this device's inputs and the
provider forced: schema, fake implementation, AOT dispatch. ``test_autograd_registration``
runs only on cpu and cuda devices (PyTorch does not implement it for other backends:
``not_applicable`` there, recorded in the case). opcheck compares the eager and the
AOT-traced outputs with ``torch.testing.assert_close``, for which NaN never equals NaN: for
a sample whose outputs hold NaN (the fp8 ops' rows with NaN and infinities) its
``test_aot_dispatch_dynamic`` runs as the same torch check (``aot_autograd_check``) with
NaN matching NaN (``equal_nan`` in the case's details).
"""

from __future__ import annotations

import functools
import traceback
from typing import Any

import torch

from opcore_conformance import irapi
from opcore_conformance import status as S
from opcore_conformance.case import Case, CheckFailed, NotApplicable, case_id
from opcore_conformance.checks._op_grid import device_sample, forced, grid
from opcore_conformance.tensors import iter_tensors, map_tensors

SUPPORTS_ARGS = "supports_args"
OPCHECK = "opcheck"
OPCHECK_UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
AUTOGRAD_DEVICES = ("cpu", "cuda")
NAN_AWARE_UTIL = "test_aot_dispatch_dynamic"  # run with NaN == NaN where outputs hold NaN


def _holds_nan(value: Any) -> bool:
    return any(
        isinstance(t, torch.Tensor) and t.is_floating_point() and bool(torch.isnan(t.float()).any())
        for _, t in iter_tensors(value)
    )


def _aot_dispatch_dynamic_equal_nan(torch_op, args, kwargs) -> str:
    """opcheck's ``test_aot_dispatch_dynamic`` (eager against AOTAutograd with dynamic
    shapes, through torch's own ``aot_autograd_check``), NaN equal to NaN; raises as it.
    ``"skip"`` where this torch has no such function (it is internal to torch's tests)."""
    import torch.utils._pytree as pytree

    try:
        from torch.testing._internal.optests.aot_autograd import aot_autograd_check
    except ImportError:
        return "skip"

    def func(*a, **k):
        a, k = pytree.tree_map_only(torch.Tensor, torch.clone, (a, k))
        return torch_op(*a, **k)

    same = functools.partial(torch.testing.assert_close, equal_nan=True)
    aot_autograd_check(func, args, kwargs, True, assert_equals_fn=same, check_gradients="auto")
    return "SUCCESS"


def collect(ctx) -> list:
    out: list[Case] = []
    if not irapi.available():
        return list(grid(ctx, SUPPORTS_ARGS, None))
    with_sa: set[tuple[str, str]] = set()
    for op_name in irapi.op_names():
        for provider, impl in irapi.impls(irapi.get_op(op_name)).items():
            if impl.supports_args is not None:
                with_sa.add((op_name, provider))
            elif ctx.wants(op=op_name, provider=provider):
                out.append(
                    Case(
                        case_id(SUPPORTS_ARGS, op_name, provider),
                        SUPPORTS_ARGS,
                        op=op_name,
                        provider=provider,
                        preset=S.NOT_APPLICABLE,
                        preset_reason=f"provider {provider!r} declares no supports_args "
                        f"(it takes every argument)",
                    )
                )
    out += list(
        grid(
            ctx,
            SUPPORTS_ARGS,
            _supports_args_body,
            providers=lambda op: [p for p in op.impls if (op.name, p) in with_sa],
        )
    )
    # opcheck traces and compiles: in quick mode, the first two samples of each dtype.
    out += list(
        grid(
            ctx,
            OPCHECK,
            _opcheck_body,
            sample_filter=(lambda names: names[:2]) if ctx.quick else None,
        )
    )
    return out


def _supports_args_body(op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        op, _, args, kwargs = device_sample(ctx, op_name, dtype, sample_name)
        fn = op.impls[provider].supports_args
        try:
            real = fn(*args, **kwargs)
        except Exception as exc:
            raise CheckFailed(
                f"supports_args of {op_name}/{provider} raised {type(exc).__name__} on "
                f"device tensors: {exc}"
            ) from None
        if type(real) is not bool:
            raise CheckFailed(
                f"supports_args of {op_name}/{provider} returned "
                f"{type(real).__name__} {real!r} on device tensors; it must return a plain bool"
            )
        # Static fake tensors (what lowering sees for a fixed shape), then symbolic sizes
        # and strides (what it sees under torch.compile's dynamic shapes): comparisons of
        # SymInts give SymBools, which a provider must turn into a bool itself.
        for kind in ("static", "symbolic"):
            answer = _supports_args_on_fake(
                fn, args, kwargs, symbolic=kind == "symbolic", where=f"{op_name}/{provider}"
            )
            if answer != real:
                raise CheckFailed(
                    f"supports_args of {op_name}/{provider} answers {answer!r} on "
                    f"{kind} fake tensors but {real!r} on device tensors"
                )
        return {"answer": real}

    return body


def _supports_args_on_fake(fn, args, kwargs, *, symbolic: bool, where: str) -> bool:
    from torch._subclasses.fake_tensor import FakeTensorMode

    kind = "symbolic" if symbolic else "static"
    if symbolic:
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=False)
        fake_args, fake_kwargs = map_tensors(
            (args, kwargs), lambda t: mode.from_tensor(t, static_shapes=False)
        )
    else:
        mode = FakeTensorMode(allow_non_fake_inputs=False)
        fake_args, fake_kwargs = map_tensors((args, kwargs), mode.from_tensor)
    try:
        with mode:
            answer = fn(*fake_args, **fake_kwargs)
    except Exception as exc:
        raise CheckFailed(
            f"supports_args of {where} raised {type(exc).__name__} on {kind} fake "
            f"tensors: it must decide from metadata (shape, dtype, device, strides) alone, "
            f"never from tensor values ({str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None
    if type(answer) is not bool:
        raise CheckFailed(
            f"supports_args of {where} returned {type(answer).__name__} {answer!r} on "
            f"{kind} fake tensors; it must return a plain bool (wrap SymBool "
            f"comparisons of symbolic sizes in bool())"
        )
    return answer


def _opcheck_body(op_name: str, provider: str, dtype: str, sample_name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        opcheck = getattr(torch.library, "opcheck", None)
        if opcheck is None:
            raise NotApplicable(f"torch {torch.__version__} has no torch.library.opcheck")
        op, sample, args, kwargs = device_sample(ctx, op_name, dtype, sample_name)
        utils = list(OPCHECK_UTILS)
        info: dict[str, Any] = {}
        equal_nan = _holds_nan(op.native(*sample.args, **dict(sample.kwargs)))
        if equal_nan:
            utils.remove(NAN_AWARE_UTIL)
            info["equal_nan"] = [NAN_AWARE_UTIL]
        if ctx.device.type in AUTOGRAD_DEVICES:
            utils.append("test_autograd_registration")
        else:
            info["not_applicable"] = {
                "test_autograd_registration": (
                    f"not implemented by PyTorch for {ctx.device.type} tensors"
                )
            }
        overloads = [("default", op.torch_op, args, kwargs)]
        if op.allow_inplace:  # the donation overload, on its own copy of the inputs
            _, _, args2, kwargs2 = device_sample(ctx, op_name, dtype, sample_name)
            overloads.append(("maybe_inplace", op.torch_op_inplace, args2, kwargs2))
        with forced(op, provider, args, kwargs):
            for overload, torch_op, a, kw in overloads:
                name = f"opcore_ir::{op_name}.{overload}"
                try:
                    result = opcheck(torch_op, a, kw, test_utils=utils)
                    if equal_nan:
                        result = dict(result or {})
                        result[NAN_AWARE_UTIL] = _aot_dispatch_dynamic_equal_nan(torch_op, a, kw)
                except NotImplementedError as exc:
                    raise NotApplicable(
                        f"opcheck({name}) cannot run on {ctx.device.type}: {exc}"
                    ) from None
                except Exception as exc:
                    first = str(exc).strip().splitlines()
                    # the stack (down to the provider's line) and opcheck's whole message
                    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                    raise CheckFailed(
                        f"torch.library.opcheck({name}) failed: "
                        f"{type(exc).__name__}: {first[0] if first else ''}",
                        {"traceback": "\n".join(stack.splitlines()[-60:])},
                    ) from None
                bad = {
                    k: v for k, v in (result or {}).items() if v not in ("SUCCESS", "xfail", "skip")
                }
                if bad:
                    raise CheckFailed(f"torch.library.opcheck({name}): {bad}")
                info[overload] = result
        return info

    return body
