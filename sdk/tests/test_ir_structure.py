"""How opcore.ir is put together: a pure priority rule, a real ``ops`` module, validators
whose message helpers never accept, imports that point one way, test helpers outside
the public namespaces."""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest
import torch

import opcore
import opcore.ir
import opcore.layers
from opcore.ir import Impl, ops, priority
from opcore.ir.ops import _checks as c
from opcore.testing import run_python

SRC = pathlib.Path(opcore.__file__).parent


# --------------------------------------------------------------------------- priority
def _impls(**providers: tuple[bool, bool]) -> dict[str, Impl]:
    """``name=(supported, takes every argument)``; ``native`` first, as on an op."""
    out = {"native": Impl("native", lambda x: x, True, None, False)}
    for name, (supported, takes_all) in providers.items():
        out[name] = Impl(
            name, lambda x: x, supported, None if takes_all else (lambda x: True), False
        )
    return out


def test_decide_is_a_function_of_its_arguments_alone():
    impls = _impls(fast=(True, False), other=(True, True), absent=(False, True))
    d = priority.decide(
        "some_op",
        impls,
        user=["fast"],
        user_source=priority.USER_SOURCE_CONFIG,
        platform_default=["absent", "other", "fast", "missing"],
        platform_name="acme",
    )
    assert d.names == ["fast", "other"]  # 'other' takes every argument: no native
    assert d.skipped["absent"].startswith("not supported")
    assert "not registered" in d.skipped["missing"]
    # warnings come back with the decision (emitting them is the caller's business)
    keys = [key for key, _ in d.warnings]
    assert ("platform-unsupported", "acme", "some_op", "absent") in keys
    assert ("platform-missing", "acme", "some_op", "missing") in keys
    again = priority.decide(
        "some_op",
        impls,
        user=["fast"],
        user_source=priority.USER_SOURCE_CONFIG,
        platform_default=["absent", "other", "fast", "missing"],
        platform_name="acme",
    )
    assert again.names == d.names and again.warnings == d.warnings


def test_decide_appends_native_and_says_so():
    d = priority.decide(
        "some_op",
        _impls(fast=(True, False)),
        user=["fast"],
        user_source=priority.USER_SOURCE_CONFIG,
        platform_default=[],
        platform_name="acme",
    )
    assert d.names == ["fast", "native"] and d.native_appended
    assert any(key[0] == "native-appended" for key, _ in d.warnings)


def test_decide_refuses_an_unknown_user_provider():
    with pytest.raises(ValueError, match=r"'nope'.*registered providers: native"):
        priority.decide(
            "some_op",
            _impls(),
            user=["nope"],
            user_source=priority.USER_SOURCE_CONFIG,
            platform_default=[],
            platform_name="acme",
        )
    with pytest.raises(ValueError, match="unregistered after the block began"):
        priority.decide(
            "some_op",
            _impls(),
            user=["nope"],
            user_source=priority.USER_SOURCE_BLOCK,
            platform_default=[],
            platform_name="acme",
        )


# --------------------------------------------------------------------------- ops module
def test_ops_module_names_its_ops_where_they_are_defined():
    from opcore.ir.ops import rms_norm

    assert rms_norm is ops.rms_norm is opcore.ir.get_op("rms_norm")
    assert inspect.getmodule(rms_norm.native).__name__ == "opcore.ir.ops._norm"
    # the module's source names every built-in op, so a reader or type checker finds it
    source = (SRC / "ir" / "ops" / "__init__.py").read_text()
    for name in ops.__all__:
        assert (
            f"import {name}" in source or f", {name}" in source or f"\n    {name},\n" in source
        ), name
    assert sorted(ops.__all__) == sorted(
        n
        for n, op in opcore.ir.all_ops().items()
        if op.native.__module__.startswith("opcore.ir.ops.")
    )


def test_registering_an_op_writes_nothing_into_the_ops_module():
    from opcore.testing.ir import temporary_op

    def structure_probe_op(x: torch.Tensor) -> torch.Tensor:
        return x

    with temporary_op(structure_probe_op) as op:
        assert "structure_probe_op" not in vars(ops)
        assert ops.structure_probe_op is op  # found through the registry
    with pytest.raises(AttributeError, match="registered ops"):
        ops.structure_probe_op  # noqa: B018


# --------------------------------------------------------------------------- validators
def test_message_helpers_never_accept():
    # A helper runs only after a rule's condition failed; handed valid arguments it still
    # raises, so the condition alone decides what is valid.
    x, w = torch.randn(2, 8), torch.ones(8)
    cache, pos = torch.randn(16, 8), torch.arange(2)
    calls = [
        lambda: c.bad_float("op", "x", x),
        lambda: c.bad_like("op", "w", x, "x", x, shape=(2, 8)),
        lambda: c.bad_weight("op", "weight", w, 8, "x", x),
        lambda: c.bad_eps("op", "epsilon", 1e-6),
        lambda: c.bad_positive_int("op", "n", 3, at_most=8, of="eight"),
        lambda: c.bad_cache("op", cache, 8, "x", x),
        lambda: c.bad_positions("op", pos, "x", x),
        lambda: c.bad_heads("op", "q", x, pos, 8, "q", x),
        lambda: c.bad_bool("op", "flag", True),
    ]
    for call in calls:
        with pytest.raises((ValueError, TypeError), match=r"^opcore\.ir\.ops\.op: argument "):
            call()


def test_one_validator_per_op_and_no_second_check():
    # The validators hold one definition: no "fast path" that returns early before a
    # full check (the pattern the old validators used).
    for name in ops.__all__:
        source = inspect.getsource(getattr(ops, name).validator)
        tree = ast.parse(source)
        early_returns = [n for n in ast.walk(tree) if isinstance(n, ast.Return)]
        assert not early_returns, (
            f"{name}: validator returns early (a fast path beside a full check)"
        )


# --------------------------------------------------------------------------- imports
def _imports(path: pathlib.Path) -> set[str]:
    """Every ``opcore`` module ``path`` imports, at any depth, outside TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("opcore")}


@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("ir/priority.py", ("opcore.ir.op", "opcore.config", "opcore.platforms")),
        ("ir/torch_lib.py", ("opcore.ir.op",)),
        ("ir/outputs.py", ("opcore.ir.op",)),
        ("env.py", ("opcore.",)),
        ("plugins.py", ("opcore.config", "opcore.ir")),
        ("platforms/kernels.py", ("opcore.config", "opcore.ir")),
        ("platforms/__init__.py", ("opcore.config", "opcore.attention")),
        ("platforms/resolution.py", ("opcore.config", "opcore.attention")),
        ("platforms/interface.py", ("opcore.config", "opcore.attention")),
        ("config.py", ("opcore.ir",)),
    ],
)
def test_imports_point_one_way(module, forbidden):
    bad = sorted(m for m in _imports(SRC / module) if m.startswith(forbidden))
    assert not bad, f"opcore/{module} imports {bad}"


# a variable name -> the file that defines what it holds (its private names are its own)
_OWNERS = {
    "op": "ir/op.py",
    "impl": "ir/op.py",
    "_op": "ir/op.py",
    "priority": "ir/priority.py",
    "torch_lib": "ir/torch_lib.py",
    "backend": "compile/backend.py",
}


def test_no_module_reaches_into_a_private_name_of_ir_or_compile():
    offenders = []
    for path in [*SRC.glob("compile/**/*.py"), *SRC.glob("ir/**/*.py")]:
        rel = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and _OWNERS.get(node.value.id, rel) != rel
            ):
                offenders.append(
                    f"{path.relative_to(SRC)}:{node.lineno} {node.value.id}.{node.attr}"
                )
    assert not offenders, offenders


def test_importing_platforms_and_plugins_leaves_config_and_ir_unloaded():
    code = (
        "import sys, opcore.platforms, opcore.plugins, opcore.platforms.kernels;"
        "print(sorted(m for m in ('opcore.config', 'opcore.ir', 'opcore.attention')"
        " if m in sys.modules))"
    )
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# --------------------------------------------------------------------------- namespaces
def test_test_helpers_are_not_in_the_public_namespaces():
    assert not hasattr(opcore.ir, "unregister_op")
    assert "unregister_op" not in opcore.ir.__all__
    assert not hasattr(opcore.layers, "clear_binding_records")
    from opcore.testing.ir import temporary_impl, temporary_op, unregister_op  # noqa: F401
