"""Compile a Triton kernel for a GPU this machine need not have, and read its machine
instructions: the one way the offline benches (`kernel_fingerprint.py`,
`prefill_registers.py`, `fp8_sass.py`, `gated_decode.py --sass`) build a kernel's
signature, compile it and count it. Triton compiles to the target's binary on any host;
nothing runs.

A launch specialises a kernel on its arguments: the types of its tensors, and which
pointers and integers are multiples of 16 (``divisible``). The second matters: without it
Triton cannot prove a load 16-byte aligned and gives up vector loads and the asynchronous
copies of pipelined loops, so the machine code is not the code a real launch runs. Name in
``divisible`` what a real launch has aligned (the tensors, and strides or sizes that are
multiples of 16 in practice); `kernel_fingerprint.py` names none, which keeps its recorded
fingerprints comparable.
"""

from __future__ import annotations

import re
from typing import Any

# One SASS line: "<control><TAB>[@[!]predicate ]OPCODE operands;".
_SASS_LINE = re.compile(r"^\S+\t(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", re.M)


def constants(fn, constexprs: dict[str, Any]) -> dict[str, Any]:
    """``constexprs`` with the kernel's default for each compile-time argument it leaves
    out, as a launch passes them (a new dict).

    Raises:
        ValueError: a compile-time argument with neither a value nor a default, or a name
            that is not an argument of ``fn``.
    """
    names = {p.name for p in fn.params}
    unknown = sorted(set(constexprs) - names)
    if unknown:
        raise ValueError(f"{fn.__name__} has no argument(s) {', '.join(unknown)}")
    out = dict(constexprs)
    for param in fn.params:
        if param.is_constexpr and param.name not in out:
            if not param.has_default:
                raise ValueError(f"{fn.__name__}: constexpr {param.name} has no value")
            out[param.name] = param.default
    return out


def signature(fn, types: dict[str, str], constexprs: dict[str, Any]) -> dict[str, str]:
    """Triton's signature of ``fn``: each runtime argument's type from ``types`` (say
    ``"*bf16"`` for a pointer, ``"fp32"`` for a float), ``"i32"`` where it names none;
    ``"constexpr"`` for each argument of `constants` (``constexprs`` and the defaults).

    Raises:
        ValueError: as `constants`; a name in ``types`` that is not an argument of ``fn``.
    """
    fixed = constants(fn, constexprs)
    unknown = sorted(set(types) - {p.name for p in fn.params})
    if unknown:
        raise ValueError(f"{fn.__name__} has no argument(s) {', '.join(unknown)}")
    return {p.name: "constexpr" if p.name in fixed else types.get(p.name, "i32") for p in fn.params}


def compile_kernel(
    fn,
    types: dict[str, str],
    constexprs: dict[str, Any],
    *,
    divisible: tuple[str, ...] | set[str] = (),
    target: str = "cuda:90",
    **options: Any,
):
    """``fn`` compiled by Triton for ``target`` (``"cuda:90"``: sm_90; ``"hip:gfx942"``)
    with `signature`'s types, the arguments of ``divisible`` specialised as multiples of 16,
    and Triton compile ``options`` (``num_warps``, ``num_stages``): the
    ``CompiledKernel``, whose ``asm`` holds the assembly and binary.

    Raises:
        ValueError: as `signature`; a name in ``divisible`` that is not a runtime argument.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fixed = constants(fn, constexprs)
    sig = signature(fn, types, fixed)
    runtime = [name for name, kind in sig.items() if kind != "constexpr"]
    bad = sorted(set(divisible) - set(runtime))
    if bad:
        raise ValueError(f"{fn.__name__}: divisible names no runtime argument {', '.join(bad)}")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    backend, _, arch = target.partition(":")
    gpu = GPUTarget(backend, int(arch) if arch.isdigit() else arch, 32 if backend == "cuda" else 64)
    src = ASTSource(fn=fn, signature=sig, constexprs=fixed, attrs=attrs)
    return triton.compile(src, target=gpu, options=options)


def sass_opcodes(compiled) -> list[str]:
    """The opcodes of a kernel compiled for an NVIDIA target, in order: every machine
    instruction, predicated ones (``@P0 LDG.E.64``) included, without the NOPs that pad
    the end. Needs the ``nvdisasm`` Triton ships."""
    from triton.tools.disasm import get_sass

    return [op for op in _SASS_LINE.findall(get_sass(compiled.asm["cubin"])) if op != "NOP"]
