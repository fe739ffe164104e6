"""Platform contract checks: is the plugin's `Platform` subclass the interface the core calls?

Check ids:
  ``platform.members``         every declared member present with its declared kind
  ``platform.signatures[<m>]`` each overridden method accepts every call the core makes
  ``platform.overrides``       no misspelled or stale members (names the core never calls,
                               members a plugin-API version removed)
  ``platform.identity``        identity attributes have the right types and values;
                               ``plugin_api`` covers the core's `opcore.PLUGIN_API_VERSION`
  ``platform.device_queries``  device queries answer with the right types
  ``platform.dtype[<dtype>]``  each claimed dtype really computes on the device
  ``platform.kernels``         ``import_kernels`` / ``import_ir_kernels`` run and are idempotent
  ``platform.priorities[<mode>]`` default priorities name registered, supported providers
  ``platform.config_hooks``    hooks accept explicit configs and never read an ambient one
  ``platform.attention``       ``get_attn_backend_candidates`` names registered, importable backends
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import inspect
from typing import Any

import torch

from opcore_conformance.case import Case, CheckFailed, NotApplicable, case_id
from opcore_conformance.options import dtype_name

# Members that platform interfaces elsewhere (vLLM's above all) have and opcore's does not.
# A plugin ported from there that still defines them expects the core to call them; it never
# will, so they are flagged: capabilities, not identities (docs/design.md#platform-interface).
STALE_MEMBERS = {
    "is_cuda": "identity checks are not part of the interface; declare capabilities",
    "is_rocm": "identity checks are not part of the interface; declare capabilities",
    "is_tpu": "identity checks are not part of the interface; declare capabilities",
    "is_xpu": "identity checks are not part of the interface; declare capabilities",
    "is_cpu": "identity checks are not part of the interface; declare capabilities",
    "is_cuda_alike": "identity checks are not part of the interface; declare capabilities",
    "is_out_of_tree": "the tier comes from the entry-point group, not from the class",
    "is_async_output_supported": "not part of the opcore interface",
    "get_current_memory_usage": "not part of the opcore interface",
    "get_device_uuid": "not part of the opcore interface",
    "get_punica_wrapper": "not part of the opcore interface",
    "get_piecewise_backend_cls": "not part of the opcore interface",
    "get_static_graph_wrapper_cls": "not part of the opcore interface",
    "check_if_supports_dtype": "claimed dtypes are `supported_dtypes`, checked by the suite",
    "supports_fp8": "fp8 support is `fp8_dtype`",
    "is_pin_memory_available": "not part of the opcore interface",
    "seed_everything": "the interface member is `manual_seed_all(seed)`",
    "set_device": "not part of the opcore interface",
    "verify_quantization": "not part of the opcore interface",
    "get_default_attn_backend": "the interface member is `get_attn_backend_candidates(cfg)`",
    "simple_compile_backend": "not part of the opcore interface",
    "ray_device_key": "not part of the opcore interface",
}


def _removed_note(name: str) -> str | None:
    """What replaces member ``name`` if a plugin-API version removed it, else None."""
    from opcore.platforms.api_version import removed_member_note

    return removed_member_note(name)


def _declared() -> dict[str, str]:
    from opcore.platforms.interface import declared_members

    return declared_members()


def _base():
    from opcore.platforms.interface import Platform

    return Platform


def _kind(value: Any) -> str:
    if isinstance(value, (staticmethod, classmethod)):
        return "method"
    if isinstance(value, property):
        return "attribute"
    return "method" if callable(value) and not isinstance(value, type) else "attribute"


def _own_members(cls: type) -> dict[str, tuple[type, Any]]:
    """Public names defined by ``cls`` and its bases below `Platform`, with the defining class."""
    base = _base()
    out: dict[str, tuple[type, Any]] = {}
    for klass in cls.__mro__:
        if (
            klass is base
            or klass is object
            or (isinstance(klass, type) and issubclass(base, klass))
        ):
            continue
        for key, value in vars(klass).items():
            if not key.startswith("_") and key not in out:
                out[key] = (klass, value)
    return out


def collect(ctx) -> list[Case]:
    p = ctx.platform
    cls = type(p)
    cases = [
        Case(case_id("platform.members"), "platform.members", body=_members),
        Case(case_id("platform.overrides"), "platform.overrides", body=_overrides),
        Case(case_id("platform.identity"), "platform.identity", body=_identity),
        Case(case_id("platform.device_queries"), "platform.device_queries", body=_device_queries),
        Case(case_id("platform.kernels"), "platform.kernels", body=_kernels),
        Case(case_id("platform.config_hooks"), "platform.config_hooks", body=_config_hooks),
        Case(case_id("platform.attention"), "platform.attention", body=_attention),
    ]
    declared = _declared()
    for name, (_, value) in sorted(_own_members(cls).items()):
        if declared.get(name) == "method" and _kind(value) == "method":
            cases.append(
                Case(
                    case_id("platform.signatures", name),
                    "platform.signatures",
                    body=_signature_body(name),
                )
            )
    for mode in ("eager", "inductor"):
        cases.append(
            Case(
                case_id("platform.priorities", mode),
                "platform.priorities",
                body=_priorities_body(mode),
            )
        )
    dtypes = getattr(cls, "supported_dtypes", ())
    if isinstance(dtypes, (tuple, list)):
        for dt in dtypes:
            if isinstance(dt, torch.dtype):
                name = dtype_name(dt)
                cases.append(
                    Case(
                        case_id("platform.dtype", name),
                        "platform.dtype",
                        dtype=name,
                        body=_dtype_body(dt),
                    )
                )
    return cases


# --------------------------------------------------------------------------- members
def _members(ctx, _tol) -> dict[str, Any]:
    cls = type(ctx.platform)
    problems = []
    for name, kind in _declared().items():
        try:
            value = inspect.getattr_static(cls, name)
        except AttributeError:
            problems.append(f"{name}: missing (declared {kind})")
            continue
        if _kind(value) != kind:
            problems.append(
                f"{name}: declared a {kind}, but {cls.__qualname__} makes it a {_kind(value)}"
            )
    abstract = sorted(getattr(cls, "__abstractmethods__", ()))
    if abstract:
        problems.append(f"abstract members not implemented: {', '.join(abstract)}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return {"members": len(_declared())}


def _signature_body(name: str):
    def body(ctx, _tol) -> dict[str, Any]:
        base_fn = getattr(_base(), name)
        base_sig = inspect.signature(base_fn)
        base_params = list(base_sig.parameters.values())[1:]  # drop self
        try:
            sig = inspect.signature(getattr(ctx.platform, name))
        except (TypeError, ValueError) as exc:
            raise CheckFailed(f"{name}: signature cannot be inspected: {exc}") from None
        params = list(sig.parameters.values())
        has_var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
        has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        by_name = {p.name: p for p in params}
        problems = []
        for i, bp in enumerate(base_params):
            if bp.kind in (bp.VAR_POSITIONAL, bp.VAR_KEYWORD):
                continue
            p = by_name.get(bp.name)
            if p is None:
                if not (has_var_pos and has_var_kw):
                    problems.append(f"parameter {bp.name!r} is missing")
                continue
            if bp.kind is bp.POSITIONAL_OR_KEYWORD and (
                i >= len(positional) or positional[i].name != bp.name
            ):
                problems.append(f"parameter {bp.name!r} must be positional #{i + 1}")
            if p.kind is p.KEYWORD_ONLY and bp.kind is not bp.KEYWORD_ONLY:
                problems.append(
                    f"parameter {bp.name!r} is keyword-only, the core passes it positionally"
                )
            if bp.default is not bp.empty and p.default is p.empty:
                problems.append(f"parameter {bp.name!r} needs a default (the core may omit it)")
        base_names = {bp.name for bp in base_params}
        for p in params:
            if (
                p.name not in base_names
                and p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ):
                problems.append(
                    f"extra parameter {p.name!r} has no default (the core never passes it)"
                )
        if problems:
            raise CheckFailed(
                f"{type(ctx.platform).__qualname__}.{name}{sig} does not accept the calls the core "
                f"makes to {name}{base_sig}: " + "; ".join(problems)
            )
        return {}

    return body


def _overrides(ctx, _tol) -> dict[str, Any]:
    declared = _declared()
    problems, extras = [], []
    for name, (klass, _value) in sorted(_own_members(type(ctx.platform)).items()):
        if name in declared:
            continue
        where = f"{klass.__qualname__}.{name}"
        removed = _removed_note(name)
        if removed is not None:
            problems.append(f"{where}: {removed}")
            continue
        if name in STALE_MEMBERS:
            problems.append(f"{where}: the core never calls it ({STALE_MEMBERS[name]})")
            continue
        close = difflib.get_close_matches(name, list(declared), n=1, cutoff=0.8)
        if close:
            problems.append(f"{where}: not an interface member; misspelled {close[0]!r}?")
        else:
            extras.append(name)
    if problems:
        raise CheckFailed("; ".join(problems), {"extra_members": extras})
    return {"extra_members": extras}


# --------------------------------------------------------------------------- identity
def _identity(ctx, _tol) -> dict[str, Any]:
    from opcore import PLUGIN_API_VERSION
    from opcore.platforms.api_version import refusal_reason
    from opcore.platforms.resolution import api_compatible, parse_plugin_api

    p = ctx.platform
    problems = []
    for attr in ("name", "device_name", "device_type", "dispatch_key", "dist_backend"):
        value = getattr(p, attr, None)
        if not isinstance(value, str) or not value:
            problems.append(f"{attr} must be a non-empty str, got {value!r}")
    try:
        torch.device(p.device_type)
    except Exception as exc:
        problems.append(f"device_type {p.device_type!r} is not a torch device type: {exc}")
    env = p.device_control_env_var
    if env is not None and (not isinstance(env, str) or not env):
        problems.append(f"device_control_env_var must be None or a non-empty str, got {env!r}")
    dts = p.supported_dtypes
    if not isinstance(dts, tuple) or not dts or not all(isinstance(d, torch.dtype) for d in dts):
        problems.append(f"supported_dtypes must be a non-empty tuple of torch.dtype, got {dts!r}")
    q = p.supported_quantization
    if not isinstance(q, tuple) or not all(isinstance(s, str) for s in q):
        problems.append(f"supported_quantization must be a tuple of str, got {q!r}")
    if p.fp8_dtype is not None and not isinstance(p.fp8_dtype, torch.dtype):
        problems.append(f"fp8_dtype must be None or a torch.dtype, got {p.fp8_dtype!r}")
    api = p.plugin_api
    if not (isinstance(api, tuple) and len(api) == 2 and all(isinstance(v, str) for v in api)):
        problems.append(f"plugin_api must be a (min, max) tuple of version strings, got {api!r}")
    else:
        try:
            compatible = api_compatible(parse_plugin_api(api))
        except ValueError as exc:
            problems.append(str(exc))
        else:
            # The resolver refuses such a class; a suite run on it directly says the same.
            if not compatible:
                cls = type(p)
                problems.append(
                    f"plugin API {PLUGIN_API_VERSION} is outside plugin_api: "
                    + refusal_reason(
                        f"{cls.__module__}.{cls.__qualname__}", api, p.name or cls.__module__
                    )
                )
    if problems:
        raise CheckFailed("; ".join(problems))
    return {}


def _device_queries(ctx, _tol) -> dict[str, Any]:
    p = ctx.platform
    problems = []
    out: dict[str, Any] = {}

    def ask(what, fn, check, expected):
        try:
            value = fn()
        except Exception as exc:
            problems.append(f"{what} raised {type(exc).__name__}: {exc}")
            return None
        if not check(value):
            problems.append(f"{what} returned {value!r}, expected {expected}")
        return value

    count = ask(
        "device_count()",
        p.device_count,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
        "an int >= 1",
    )
    out["device_count"] = count
    out["device_name"] = ask(
        "get_device_name(0)",
        lambda: p.get_device_name(0),
        lambda v: isinstance(v, str) and v,
        "a non-empty str",
    )
    ask(
        "get_device_total_memory(0)",
        lambda: p.get_device_total_memory(0),
        lambda v: isinstance(v, int) and v > 0,
        "an int > 0 (bytes)",
    )
    ask(
        "get_device_capability(0)",
        lambda: p.get_device_capability(0),
        lambda v: (
            v is None
            or (isinstance(v, tuple) and len(v) == 2 and all(isinstance(i, int) for i in v))
        ),
        "None or (major, minor)",
    )
    ask(
        "tensor_descriptor_copies(0)",
        lambda: p.tensor_descriptor_copies(0),
        lambda v: isinstance(v, bool),
        "a bool",
    )
    ask("synchronize()", p.synchronize, lambda v: True, "")
    ask("manual_seed_all(0)", lambda: p.manual_seed_all(0), lambda v: True, "")
    ask("empty_cache()", p.empty_cache, lambda v: True, "")

    def inference():
        cm = p.inference_mode()
        with cm:
            t = torch.ones(2, device=ctx.device)
            return (t * 2).requires_grad is False

    ask("inference_mode()", inference, lambda v: v is True, "a context manager disabling autograd")
    ask(
        "device(0)",
        lambda: p.device(0),
        lambda v: isinstance(v, torch.device) and v.type == p.device_type,
        f"a torch.device of type {p.device_type!r}",
    )
    if problems:
        raise CheckFailed("; ".join(problems), out)
    return out


def _dtype_body(dtype: torch.dtype):
    """A claimed dtype must create, fill, compute and convert on the device, and agree with
    the CPU on values that are exact in it."""

    def body(ctx, _tol) -> dict[str, Any]:
        dev = ctx.device
        steps = []
        try:
            steps.append("create")
            a = torch.arange(1, 9, dtype=torch.float32).reshape(2, 4).to(dev).to(dtype)
            b = torch.full((2, 4), 0.5, dtype=dtype, device=dev)
            steps.append("add/mul")
            c = a * b + a
            steps.append("reduce")
            s = c.sum(dim=-1)
            steps.append("exp/rsqrt")
            e = torch.rsqrt(c.float()).to(dtype) + torch.exp(b)
            steps.append("matmul")
            m = a @ b.transpose(0, 1)
            steps.append("convert")
            back = [x.to("cpu", torch.float64) for x in (c, s, e, m)]
        except Exception as exc:
            raise CheckFailed(
                f"platform claims {dtype_name(dtype)} in supported_dtypes, but {steps[-1]} failed "
                f"on {dev}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        ca = torch.arange(1, 9, dtype=torch.float64).reshape(2, 4)
        expect_c = ca * 1.5
        expect_s = expect_c.sum(-1)
        expect_m = ca @ torch.full((4, 2), 0.5, dtype=torch.float64)
        for what, got, want in (
            ("a*b+a", back[0], expect_c),
            ("sum", back[1], expect_s),
            ("matmul", back[3], expect_m),
        ):
            if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-2, atol=1e-2):
                raise CheckFailed(
                    f"platform claims {dtype_name(dtype)}, but {what} on {dev} gives "
                    f"{got.flatten().tolist()} where {want.flatten().tolist()} is exact"
                )
        if c.dtype != dtype or c.device.type != dev.type:
            raise CheckFailed(f"{dtype_name(dtype)} arithmetic returned {c.dtype} on {c.device}")
        return {}

    return body


# --------------------------------------------------------------------------- hooks
def _kernels(ctx, _tol) -> dict[str, Any]:
    p = ctx.platform
    for hook in ("import_kernels", "import_ir_kernels"):
        for attempt in (1, 2):
            try:
                getattr(p, hook)()
            except Exception as exc:
                when = "first" if attempt == 1 else "again: hooks must be idempotent"
                raise CheckFailed(
                    f"{hook}() raised on call {attempt} ({when}): {type(exc).__name__}: {exc}"
                ) from None
    return {}


def _configs() -> list[tuple[str, Any]]:
    from opcore.config import OpcoreConfig

    out = [("default", OpcoreConfig())]
    c = OpcoreConfig()
    c.compilation.mode = "inductor"
    out.append(("inductor", c))
    c = OpcoreConfig()
    c.compilation.custom_ops = ["none", "+rms_norm"]
    out.append(("custom_ops none,+rms_norm", c))
    c = OpcoreConfig()
    c.kernel.ir_op_priority = {"rms_norm": ["native"]}
    out.append(("ir_op_priority rms_norm=native", c))
    c = OpcoreConfig()
    c.attention.backend = "TORCH_NATIVE"
    out.append(("attention.backend TORCH_NATIVE", c))
    return out


@contextlib.contextmanager
def _no_ambient_config():
    """Make any read of the ambient config inside the block an error: hooks receive the
    config explicitly (docs/design.md#platform-interface) and must not fetch one of their own."""
    import opcore.settings as C

    original = C.get_current_config

    def forbidden():
        raise AssertionError(
            "hook read the ambient config (opcore.settings.get_current_config); "
            "use the config it was given"
        )

    C.get_current_config = forbidden
    try:
        yield
    finally:
        C.get_current_config = original


def _config_hooks(ctx, _tol) -> dict[str, Any]:
    p = ctx.platform
    problems = []
    with _no_ambient_config():
        for label, cfg in _configs():
            for hook in ("apply_config_platform_defaults", "check_and_update_config"):
                try:
                    ret = getattr(p, hook)(cfg)
                except Exception as exc:
                    problems.append(f"{hook}({label}) raised {type(exc).__name__}: {exc}")
                    continue
                if ret is not None:
                    problems.append(
                        f"{hook}({label}) returned {ret!r}; it updates the config in place and "
                        "returns None"
                    )
            try:
                prio = p.get_default_ir_op_priority(cfg)
                if not isinstance(prio, dict) or not all(
                    isinstance(k, str)
                    and isinstance(v, list)
                    and all(isinstance(s, str) for s in v)
                    for k, v in prio.items()
                ):
                    problems.append(
                        f"get_default_ir_op_priority({label}) returned {prio!r}, "
                        f"expected dict[str, list[str]]"
                    )
            except Exception as exc:
                problems.append(
                    f"get_default_ir_op_priority({label}) raised {type(exc).__name__}: {exc}"
                )
        for label, call in (
            ("None", lambda: p.pre_register_and_update(None)),
            ("a parser", lambda: p.pre_register_and_update(argparse.ArgumentParser())),
        ):
            try:
                call()
            except Exception as exc:
                problems.append(
                    f"pre_register_and_update({label}) raised {type(exc).__name__}: {exc}"
                )
        try:
            comm = p.get_device_communicator_cls()
            if comm is not None and not isinstance(comm, str):
                problems.append(
                    f"get_device_communicator_cls() returned {comm!r}, expected a dotted path "
                    "or None"
                )
        except Exception as exc:
            problems.append(f"get_device_communicator_cls() raised {type(exc).__name__}: {exc}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return {}


def _priorities_body(mode: str):
    def body(ctx, _tol) -> dict[str, Any]:
        from opcore.config import OpcoreConfig
        from opcore_conformance import irapi

        if not irapi.available():
            raise NotApplicable(f"opcore.ir is not importable: {irapi.unavailable_reason()}")
        cfg = OpcoreConfig()
        cfg.compilation.mode = mode
        prio = ctx.platform.get_default_ir_op_priority(cfg)
        problems = []
        for op_name, providers in sorted(prio.items()):
            op = irapi.get_op(op_name)
            if op is None:
                problems.append(
                    f"{op_name!r} is not a registered op "
                    f"(registered: {', '.join(irapi.op_names())})"
                )
                continue
            impls = irapi.impls(op)
            for provider in providers:
                impl = impls.get(provider)
                if impl is None:
                    problems.append(
                        f"{op_name}: provider {provider!r} is not registered "
                        f"(registered: {', '.join(sorted(impls))})"
                    )
                elif not irapi.impl_supported(impl):
                    problems.append(
                        f"{op_name}: provider {provider!r} is registered but not supported here"
                    )
        if problems:
            raise CheckFailed(
                f"get_default_ir_op_priority(mode={mode}) = {prio!r}: " + "; ".join(problems)
            )
        return {"priority": prio}

    return body


def _attention(ctx, _tol) -> dict[str, Any]:
    p = ctx.platform
    try:
        from opcore.attention.selector_config import AttentionSelectorConfig
    except ImportError as exc:
        raise NotApplicable(f"opcore.attention is not importable: {exc}") from None
    dtype = p.supported_dtypes[0] if p.supported_dtypes else torch.float32
    cfg = AttentionSelectorConfig(
        head_size=128, num_heads=32, num_kv_heads=8, dtype=dtype, device_type=p.device_type
    )
    try:
        candidates = p.get_attn_backend_candidates(cfg)
    except Exception as exc:
        raise CheckFailed(
            f"get_attn_backend_candidates(cfg) raised {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(candidates, list) or not all(isinstance(c, str) for c in candidates):
        raise CheckFailed(
            f"get_attn_backend_candidates(cfg) returned {candidates!r}, expected list[str]"
        )
    # The registry alone maps a name to its class; the platform registers its own names in
    # import_kernels, which load_registrations runs for the current platform.
    from opcore.attention.registry import backend_class_path, load_backend_class
    from opcore.attention.selector import load_registrations

    load_registrations(p)
    answered, problems = {}, []
    for name in candidates:
        try:
            path = backend_class_path(name)
        except ValueError as exc:
            problems.append(
                f"candidate {name!r}: {exc} (register it with register_backend in import_kernels)"
            )
            continue
        try:
            load_backend_class(path)
        except Exception as exc:
            problems.append(
                f"candidate {name!r} = {path!r} does not load: {type(exc).__name__}: {exc}"
            )
            continue
        answered[name] = path
    if problems:
        raise CheckFailed("; ".join(problems), {"candidates": candidates})
    return {"candidates": candidates, "classes": answered}
