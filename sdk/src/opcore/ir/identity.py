"""Provider identity: a hash of the provider's source, for compile caches and tuning tables.

The whole source file of the provider function is hashed (a kernel usually lives in
helpers next to it), together with the op, provider and function names. Functions
without a source file (built in, generated) fall back to their code object. A provider
may name more sources (`hash_sources`): files outside its own whose code also decides
what it computes, such as shared launch helpers or its tuning launch space.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable


def hash_source(fn: Callable, *, op_name: str, provider: str) -> str:
    h = hashlib.sha256()
    qualified = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
    h.update(f"{op_name}\0{provider}\0{qualified}\0".encode())
    target = inspect.unwrap(fn)
    path = None
    try:
        path = inspect.getsourcefile(target)
    except TypeError:
        pass
    if path is not None:
        try:
            with open(path, "rb") as f:
                h.update(f.read())
            return h.hexdigest()
        except OSError:
            pass
    code = getattr(target, "__code__", None)
    if code is not None:
        h.update(code.co_code)
        h.update(repr(code.co_consts).encode())
    else:
        h.update(repr(target).encode())
    return h.hexdigest()


def hash_source_pair(first: str, second: str) -> str:
    """One identity for a provider made of two functions."""
    return hashlib.sha256(f"{first}\0{second}".encode()).hexdigest()


def hash_sources(sources) -> str:
    """One hash over the source files of ``sources`` (modules or functions), each file
    once, in path order; an object without a source file adds its qualified name."""
    paths, names = set(), set()
    for src in sources:
        try:
            path = inspect.getsourcefile(inspect.unwrap(src))
        except TypeError:
            path = None
        if path is None:
            names.add(f"{getattr(src, '__module__', '')}.{getattr(src, '__qualname__', src)}")
        else:
            paths.add(path)
    h = hashlib.sha256()
    for path in sorted(paths):
        try:
            with open(path, "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(path.encode())
        h.update(b"\0")
    for name in sorted(names):
        h.update(name.encode() + b"\0")
    return h.hexdigest()
