"""Torch ops opcore defines and removes again leave torch's registries sound.

TorchScript's operator registry keys an op by its name without the overload plus its
argument and return types. Overloads of one name that share those lose their entries when
one of them is removed: the rest point at freed dispatcher state, and a later removal (at
the latest, at interpreter exit) or lookup of the name aborts the process. The opaque
provider ops are therefore one torch op per provider; an ``opcore_ir`` op whose default
and ``maybe_inplace`` overloads share a key is refused once removed. The scripts run in a
child process because the defect kills the process that meets it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from opcore.compile import opaque
from opcore.ir import ops
from opcore.testing.ir import temporary_impl


def _plus(k):
    def fn(x, weight, epsilon, variance_size=None):
        return ops.rms_norm.native(x, weight, epsilon, variance_size) + k

    return fn


def _add_rms(x, x_residual, weight, epsilon, variance_size=None):
    return ops.fused_add_rms_norm.native(x, x_residual, weight, epsilon, variance_size)


def _add_rms_in_place(x, x_residual, weight, epsilon, variance_size=None):
    out, residual = _add_rms(x, x_residual, weight, epsilon, variance_size)
    x.copy_(out)
    x_residual.copy_(residual)
    return x, x_residual


def test_each_providers_opaque_op_is_a_torch_op_of_its_own():
    with (
        temporary_impl(ops.rms_norm, "test_life_a", _plus(1)),
        temporary_impl(ops.rms_norm, "test_life_b", _plus(2)),
        temporary_impl(
            ops.fused_add_rms_norm,
            "test_life_pair",
            _add_rms_in_place,
            inplace=True,
            functional=_add_rms,
        ),
    ):
        wanted = [
            (ops.rms_norm, "test_life_a", False),
            (ops.rms_norm, "test_life_b", False),
            (ops.fused_add_rms_norm, "test_life_pair", False),
            (ops.fused_add_rms_norm, "test_life_pair", True),
        ]
        names = set()
        for op, provider, out_of_place in wanted:
            overload = opaque.get(op, op.impls[provider], out_of_place=out_of_place)
            name = overload._schema.name
            names.add(name)
            # one schema under the name: no other provider or variant shares its key
            assert len(torch._C._jit_get_schemas_for_operator(name)) == 1, name
        assert len(names) == len(wanted)
        x, w = torch.randn(2, 8), torch.randn(8)
        got = opaque.get(ops.rms_norm, ops.rms_norm.impls["test_life_b"])(x, w, 1e-6)
        torch.testing.assert_close(got, ops.rms_norm.native(x, w, 1e-6) + 2)


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_redefined_opaque_ops_and_interpreter_exit_do_not_abort():
    # Providers re-registered with new functions redefine their opaque ops (the old ones
    # are removed); the in-place provider adds ops of another schema under the op's name.
    done = _run(
        """
        import torch
        from opcore.compile import opaque
        from opcore.ir import ops
        from opcore.testing.ir import temporary_impl

        op = ops.fused_add_rms_norm

        def plus(k):
            def fn(x, x_residual, weight, epsilon, variance_size=None):
                out, residual = op.native(x, x_residual, weight, epsilon, variance_size)
                return out + k, residual
            return fn

        def in_place(x, x_residual, weight, epsilon, variance_size=None):
            out, residual = op.native(x, x_residual, weight, epsilon, variance_size)
            x.copy_(out)
            x_residual.copy_(residual)
            return x, x_residual

        x, r, w = torch.randn(2, 8), torch.randn(2, 8), torch.randn(8)
        want = op.native(x, r, w, 1e-6)[0]
        for round_ in range(4):
            with (
                temporary_impl(op, "test_a", plus(round_)),
                temporary_impl(op, "test_b", plus(round_ + 1)),
                temporary_impl(op, "test_c", in_place, inplace=True, functional=plus(0)),
            ):
                for provider, k in (("test_a", round_), ("test_b", round_ + 1)):
                    got = opaque.get(op, op.impls[provider])(x, r, w, 1e-6)[0]
                    torch.testing.assert_close(got, want + k)
                impl = op.impls["test_c"]
                x2, r2 = x.clone(), r.clone()
                opaque.get(op, impl)(x2, r2, w, 1e-6)
                torch.testing.assert_close(x2, want)
                got = opaque.get(op, impl, out_of_place=True)(x, r, w, 1e-6)[0]
                torch.testing.assert_close(got, want)
        print("rounds done")
        """
    )
    assert done.returncode == 0 and "rounds done" in done.stdout, done.stderr[-3000:]


def test_a_removed_op_with_an_inplace_overload_cannot_take_its_name_again():
    done = _run(
        """
        import torch
        from opcore.testing.ir import temporary_op

        def life_scale(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return x * weight

        x, w = torch.randn(2, 4), torch.randn(4)
        with temporary_op(life_scale, allow_inplace=True) as op:
            torch.testing.assert_close(op.maybe_inplace(x.clone(), w), x * w)
        try:
            with temporary_op(life_scale, allow_inplace=True):
                pass
        except ValueError as e:
            print("refused:", e)
        with temporary_op(life_scale, name="life_scale_plain") as op:  # no inplace overload
            op(x, w)
        with temporary_op(life_scale, name="life_scale_plain") as op:  # its name is free again
            torch.testing.assert_close(op(x, w), x * w)
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: torch op opcore_ir::life_scale had a maybe_inplace overload" in done.stdout
    assert "use another name" in done.stdout
