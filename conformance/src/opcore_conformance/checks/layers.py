"""Layer checks: `CustomOp` bindings and out-of-tree replacements.

``layers.binding[<op>]``: constructing the registered layer (which builds the ``register_oot``
replacement when a plugin registered one) under an explicit config with ``custom_ops=["all"]``
binds ``forward`` to the replacement's ``forward_oot`` when it defines one and to
``forward_native`` otherwise (plugin API 2.0: kernels reach ``forward_native`` as
`opcore.ir` providers, the platform never picks a layer method); with ``["none"]`` it binds
``forward_native``; and the class built is the registered replacement when there is one.

``layers.agree[<op>-<dtype>]``: the bound forward agrees with the in-tree class's
``forward_native`` on the device, within the op's tolerance, for every call form of the layer
(e.g. RMSNorm with and without residual). Both sides dispatch ops by the platform's
priority, so the check has teeth for a replacement's ``forward_oot`` and for a replacement
that changes the layer's state; providers themselves are checked op by op by ``numerics``.

Layers are built from the examples below, keyed by the stable op name. A layer registered
by a plugin under a new name gets a ``not_applicable`` case until it has an example.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opcore_conformance import status as S
from opcore_conformance.case import Case, CheckFailed, NotApplicable, Tolerance, case_id
from opcore_conformance.options import DEFAULT_DTYPES, dtype_from_name
from opcore_conformance.tensors import compare, iter_tensors
from opcore_conformance.wording import call_words, output_words

CHECK = "layers"


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float32)


# op name -> (build(dtype) -> module, calls(dtype, generator) -> list of argument tuples)
Example = tuple[Callable[[torch.dtype], Any], Callable[[torch.dtype, torch.Generator], list[tuple]]]


def _examples() -> dict[str, Example]:
    from opcore import layers as L

    def rms_norm(dt):
        m = L.RMSNorm(96, eps=1e-6, dtype=dt)
        with torch.no_grad():
            m.weight.copy_(1 + 0.5 * _randn(torch.Generator().manual_seed(1), 96))
        return m

    def rms_calls(dt, g):
        x, r = _randn(g, 5, 96).to(dt), _randn(g, 5, 96).to(dt)
        return [(x,), (x, r)]

    def positions(g, n, max_pos):
        return torch.randint(0, max_pos, (n,), generator=g, dtype=torch.int64)

    def rope_calls(dt, g):
        pos = positions(g, 7, 256)
        return [
            (pos, _randn(g, 7, 4 * 64).to(dt), _randn(g, 7, 2 * 64).to(dt)),
            (pos, _randn(g, 7, 4 * 64).to(dt), None),
        ]

    def qknorm(dt):
        m = L.QKNormRoPE(4, 2, 64, eps=1e-6, max_position=256, dtype=dt)
        with torch.no_grad():
            g = torch.Generator().manual_seed(2)
            m.q_weight.copy_(1 + 0.5 * _randn(g, 64))
            m.k_weight.copy_(1 + 0.5 * _randn(g, 64))
        return m

    return {
        "rms_norm": (rms_norm, rms_calls),
        "silu_and_mul": (lambda dt: L.SiluAndMul(), lambda dt, g: [(_randn(g, 5, 2 * 48).to(dt),)]),
        "gelu_and_mul": (
            lambda dt: L.GeluAndMul("tanh"),
            lambda dt, g: [(_randn(g, 5, 2 * 40).to(dt),)],
        ),
        "rotary_embedding": (
            lambda dt: L.RotaryEmbedding(64, rotary_dim=32, max_position=256, is_neox=False),
            rope_calls,
        ),
        "split_qkv_rmsnorm_rope": (
            qknorm,
            lambda dt, g: [(_randn(g, 7, (4 + 2 * 2) * 64).to(dt), positions(g, 7, 256))],
        ),
    }


def _registry() -> dict[str, Any]:
    from types import SimpleNamespace

    from opcore.layers import registered_layers

    return {
        name: SimpleNamespace(name=name, base=base, oot=oot)
        for name, (base, oot) in registered_layers().items()
    }


def collect(ctx) -> list[Case]:
    try:
        from opcore.layers import CustomOp
    except ImportError as exc:
        return [
            Case(
                case_id(CHECK),
                CHECK,
                preset=S.NOT_APPLICABLE,
                preset_reason=f"opcore.layers is not importable: {exc}",
            )
        ]
    examples = _examples()
    claimed = {str(d).removeprefix("torch.") for d in ctx.platform.supported_dtypes}
    out = []
    for name, entry in sorted(_registry().items()):
        if not issubclass(entry.base, CustomOp) or not ctx.wants(op=name):
            continue
        if name not in examples:
            out.append(
                Case(
                    case_id("layers.binding", name),
                    "layers.binding",
                    op=name,
                    preset=S.NOT_APPLICABLE,
                    preset_reason=f"no conformance example for layer {name!r} "
                    f"({entry.base.__qualname__})",
                )
            )
            continue
        build, calls = examples[name]
        out.append(
            Case(
                case_id("layers.binding", name),
                "layers.binding",
                op=name,
                body=_binding_body(name, build),
            )
        )
        for dtype in DEFAULT_DTYPES:
            c = Case(
                case_id("layers.agree", name, dtype),
                "layers.agree",
                op=name,
                dtype=dtype,
                body=_agree_body(name, build, calls, dtype),
            )
            if dtype not in claimed:
                c.preset, c.preset_reason = S.UNSUPPORTED, f"platform does not claim {dtype}"
            out.append(c)
    return out


def _config(custom_ops: list[str]):
    from opcore.config import OpcoreConfig

    cfg = OpcoreConfig()
    cfg.compilation.custom_ops = custom_ops
    return cfg


def _expected_method(entry) -> str:
    """The binding rule of plugin API 2.0, restated: a registered replacement's
    ``forward_oot`` when it defines one (below `CustomOp`), else ``forward_native``."""
    from opcore.layers import CustomOp

    if entry.oot is None:
        return "forward_native"
    for klass in entry.oot.__mro__:
        if klass is CustomOp:
            break
        if "forward_oot" in vars(klass):
            return "forward_oot"
    return "forward_native"


def _build(name: str, build, dtype: torch.dtype, custom_ops: list[str]):
    from opcore.settings import set_current_config

    with set_current_config(_config(custom_ops)):
        try:
            return build(dtype)
        except Exception as exc:
            raise CheckFailed(
                f"constructing layer {name!r} raised {type(exc).__name__}: {exc}"
            ) from None


def _binding_body(name: str, build):
    def body(ctx, _tol) -> dict[str, Any]:
        entry = _registry()[name]
        layer = _build(name, build, torch.float32, ["all"])
        problems = []
        want_cls = entry.oot or entry.base
        if type(layer) is not want_cls:
            problems.append(
                f"constructing {entry.base.__qualname__} built {type(layer).__qualname__}, "
                f"expected the registered {want_cls.__qualname__}"
            )
        expected = _expected_method(entry)
        if layer.bound_method != expected:
            why = (
                "the registered replacement defines forward_oot"
                if expected == "forward_oot"
                else "no registered replacement defines forward_oot"
            )
            problems.append(
                f"{type(layer).__qualname__} bound {layer.bound_method}, expected "
                f"{expected} ({why})"
            )
        off = _build(name, build, torch.float32, ["none"])
        if off.bound_method != "forward_native":
            problems.append(
                f"with custom_ops=['none'] {type(off).__qualname__} bound "
                f"{off.bound_method}, expected forward_native"
            )
        if problems:
            raise CheckFailed("; ".join(problems))
        return {
            "class": f"{type(layer).__module__}.{type(layer).__qualname__}",
            "method": layer.bound_method,
            "replacement": entry.oot is not None,
        }

    return body


def _tolerance(name: str, dtype: torch.dtype) -> Tolerance:
    from opcore_conformance import irapi

    op = irapi.get_op(name) if irapi.available() else None
    if op is None:
        raise NotApplicable(f"no op {name!r} to take the tolerance from")
    return Tolerance(*op.tolerance(dtype))


def _agree_body(name: str, build, calls, dtype_name_: str):
    def body(ctx, _tol) -> dict[str, Any]:
        dtype = dtype_from_name(dtype_name_)
        entry = _registry()[name]
        layer = _build(name, build, dtype, ["all"]).to(ctx.device)
        tol = _tolerance(name, dtype)
        g = torch.Generator().manual_seed(0)
        metrics: dict[str, Any] = {
            "atol": tol.atol,
            "rtol": tol.rtol,
            "max_ratio": 0.0,
            "max_abs": 0.0,
            "method": layer.bound_method,
            "class": type(layer).__qualname__,
            "ref_dtype": dtype_name_,
            "ref_device": str(ctx.device),
        }
        problems = []
        for args in calls(dtype, g):
            dev_args = tuple(a.to(ctx.device) if isinstance(a, torch.Tensor) else a for a in args)
            call = call_words(entry.base.forward_native, dev_args)  # which call, in words
            try:
                got = layer(*dev_args)
            except Exception as exc:
                raise CheckFailed(
                    f"{type(layer).__qualname__}.{layer.bound_method} ({call}) "
                    f"raised {type(exc).__name__}: {exc}"
                ) from None
            want = entry.base.forward_native(layer, *dev_args)
            for (path, o), (_, w) in zip(iter_tensors(got), iter_tensors(want), strict=False):
                if (o is None) != (w is None):
                    problems.append(f"{call}: {output_words(path)} is None on one side only")
                    continue
                if o is None or w is None:  # both None (one side only is reported above)
                    continue
                if o.shape != w.shape or o.dtype != w.dtype:
                    problems.append(
                        f"{call}: {output_words(path)} is {tuple(o.shape)} {o.dtype}, native "
                        f"{tuple(w.shape)} {w.dtype}"
                    )
                    continue
                m = compare(o, w, tol.atol, tol.rtol)
                metrics["max_ratio"] = max(metrics["max_ratio"], m["max_ratio"])
                metrics["max_abs"] = max(metrics["max_abs"], m["max_abs"])
                if m["mismatched"]:
                    problems.append(
                        f"{call}: {output_words(path)}: {m['mismatched']}/{m['numel']} elements "
                        f"differ from forward_native beyond atol={tol.atol:g} rtol={tol.rtol:g}"
                    )
        if problems:
            raise CheckFailed(
                f"{type(layer).__qualname__}.{layer.bound_method} disagrees with "
                f"{entry.base.__qualname__}.forward_native: " + "; ".join(problems),
                metrics,
            )
        return metrics

    return body
