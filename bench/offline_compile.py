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

import os
import re
import subprocess
import tempfile
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


def gpu_target(target: str):
    """Triton's ``GPUTarget`` for ``"backend:arch"`` (``"cuda:90"``, ``"hip:gfx942"``)."""
    from triton.backends.compiler import GPUTarget

    backend, _, arch = target.partition(":")
    warp = 32 if backend == "cuda" else 64
    return GPUTarget(backend, int(arch) if arch.isdigit() else arch, warp)


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
    from triton.compiler import ASTSource

    fixed = constants(fn, constexprs)
    sig = signature(fn, types, fixed)
    runtime = [name for name, kind in sig.items() if kind != "constexpr"]
    bad = sorted(set(divisible) - set(runtime))
    if bad:
        raise ValueError(f"{fn.__name__}: divisible names no runtime argument {', '.join(bad)}")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    gpu = gpu_target(target)
    src = ASTSource(fn=fn, signature=sig, constexprs=fixed, attrs=attrs)
    return triton.compile(src, target=gpu, options=options)


def bind_call(fn, args: tuple, kwargs: dict[str, Any], target: str = "cuda:90") -> tuple:
    """``(signature, constexprs, attrs, options)``: how the launch ``fn[grid](*args,
    **kwargs)`` specialises ``fn`` for ``target``, read by Triton's own binder (tensor
    dtypes and 16-byte alignment, integers equal to 1 or multiples of 16, the compile-time
    arguments, ``num_warps``/``num_stages``). Tensors on the ``meta`` device serve: their
    data pointers read as 0, aligned, as a caching allocator's blocks are.

    Uses Triton's internal binder (``create_function_from_signature``, ``_pack_args``), as
    Triton 3.6 names them: a bench's tool, not an API."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(gpu_target(target))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, sig, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return sig, constexprs, attrs, options


def compile_call(fn, args: tuple, kwargs: dict[str, Any], target: str = "cuda:90"):
    """``fn`` compiled for ``target`` as the launch ``fn[grid](*args, **kwargs)`` would
    compile it (`bind_call`): the binary a real launch with these arguments runs."""
    import triton
    from triton.compiler import ASTSource

    sig, constexprs, attrs, options = bind_call(fn, args, kwargs, target)
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=gpu_target(target), options=options.__dict__)


def ptxas_report(compiled, arch: int = 90) -> dict[str, int]:
    """``{"registers", "spill_stores", "spill_loads", "shared"}`` of a kernel compiled for
    ``sm_<arch>``: registers per thread and spill bytes from the ``ptxas -v`` Triton ships,
    run on the kernel's PTX (which carries the launch's thread count, so the register
    limit is the launch's), and the shared memory from Triton's metadata.

    Raises:
        RuntimeError: ``ptxas -v`` printed a report without one of the figures.
    """
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    suffix = "a" if arch == 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        report = subprocess.run(
            [ptxas, "-v", f"--gpu-name=sm_{arch}{suffix}", ptx, "-o", os.path.join(tmp, "k.o")],
            capture_output=True, text=True, timeout=300, check=True,
        ).stderr  # fmt: skip

    def number(pattern: str) -> int:
        m = re.search(pattern, report)
        if m is None:  # a report this parser does not know: no figure rather than a 0
            raise RuntimeError(f"ptxas -v printed no {pattern!r}:\n{report}")
        return int(m.group(1))

    return {
        "registers": number(r"Used (\d+) registers"),
        "spill_stores": number(r"(\d+) bytes spill stores"),
        "spill_loads": number(r"(\d+) bytes spill loads"),
        "shared": int(compiled.metadata.shared),
    }


def sass_opcodes(compiled) -> list[str]:
    """The opcodes of a kernel compiled for an NVIDIA target, in order: every machine
    instruction, predicated ones (``@P0 LDG.E.64``) included, without the NOPs that pad
    the end. Needs the ``nvdisasm`` Triton ships."""
    from triton.tools.disasm import get_sass

    return [op for op in _SASS_LINE.findall(get_sass(compiled.asm["cubin"])) if op != "NOP"]
