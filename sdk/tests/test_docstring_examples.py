"""The examples in the public entry points' docstrings run and print what they show.

Each entry point must also document its arguments, return value and errors (Google
style, as the docs site renders them with mkdocstrings). The examples clean up after
themselves, so running them leaves the registries as they were.
"""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

# (module, attribute path); an empty path is the module itself, for a module attribute
# (``opcore.platforms.current_platform``) documented in its module's docstring.
ENTRY_POINTS = [
    ("opcore.ir.op", "register_op"),
    ("opcore.ir.op", "IrOp.register_impl"),
    ("opcore.ir.op", "IrOp.set_priority"),
    ("opcore.ir.op", "IrOp.dispatch"),
    ("opcore.ir.op", "IrOp.explain"),
    ("opcore.layers.custom_op", "_Replaceable.register_oot"),
    ("opcore.attention.registry", "register_backend"),
    ("opcore.attention.selector", "select_backend"),
    ("opcore.platforms", ""),  # current_platform
    ("opcore.platforms", "get_current_platform"),
    ("opcore.settings", "create_config"),
]
SECTIONS = ("Raises:", "Examples:")  # and Args: / Returns: for functions that have them


def _resolve(module: str, path: str) -> object:
    obj: object = importlib.import_module(module)
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return getattr(obj, "__func__", obj)


def _ids(entry: tuple[str, str]) -> str:
    return entry[1] or "current_platform"


def _required_sections(obj: object) -> list[str]:
    if inspect.ismodule(obj):
        return list(SECTIONS)
    params = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
    return (["Args:"] if params else []) + ["Returns:", *SECTIONS]


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=_ids)
def test_docstring_documents_the_contract(entry: tuple[str, str]) -> None:
    obj = _resolve(*entry)
    doc = obj.__doc__ or ""
    missing = [s for s in _required_sections(obj) if s not in doc]
    assert not missing, f"{entry[0]}.{entry[1]}: docstring lacks {missing}"


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=_ids)
def test_docstring_example_runs(entry: tuple[str, str]) -> None:
    module, path = entry
    obj = _resolve(module, path)
    tests = doctest.DocTestFinder(recurse=False).find(obj, f"{module}.{path}")
    examples = [t for t in tests if t.examples]
    assert examples, f"{module}.{path}: no >>> example in the docstring"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in examples:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{module}.{path}: {result.failed} example line(s) failed"
