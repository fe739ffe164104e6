"""Validator hardening: epsilon values, arity errors that name the op, and zero-token
rotary embedding on every provider."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
import torch

from opcore.ir import ops
from opcore.ir.rope import build_cos_sin_cache
from opcore.testing import run_python

X = torch.randn(3, 8)
W = torch.ones(8)
CACHE = build_cos_sin_cache(16, 32)
POS = torch.arange(3)
QKV = torch.randn(3, (2 + 2) * 16)


# --------------------------------------------------------------------------- epsilon
def _eps_calls(eps):
    """(op name, call) per op taking ``epsilon``; each call takes the validator's fast path
    when ``eps`` is a valid float (as the first case of each op shows)."""
    return [
        ("rms_norm", lambda: ops.rms_norm(X, W, eps)),
        ("rms_norm", lambda: ops.rms_norm(X, None, eps)),
        ("fused_add_rms_norm", lambda: ops.fused_add_rms_norm(X, X, W, eps)),
        (
            "split_qkv_rmsnorm_rope",
            lambda: ops.split_qkv_rmsnorm_rope(QKV, None, None, eps, POS, CACHE, 2, 1, 16, True),
        ),
    ]


def _eps_calls_full_path(eps):
    """The same ops with arguments the fast paths do not take (``variance_size`` given,
    weights of another layout), so the full checks decide."""
    qw = torch.ones(16)
    return [
        ("rms_norm", lambda: ops.rms_norm(X, W, eps, 4)),
        ("fused_add_rms_norm", lambda: ops.fused_add_rms_norm(X, X, None, eps, 4)),
        (
            "split_qkv_rmsnorm_rope",
            lambda: ops.split_qkv_rmsnorm_rope(
                QKV, qw, qw[None].expand(1, 16)[0], eps, POS, CACHE, 2, 1, 16, True
            ),
        ),
    ]


BAD_EPS = [-1e-6, -1.0, math.nan, math.inf, -math.inf, -1]


@pytest.mark.parametrize("eps", BAD_EPS, ids=repr)
@pytest.mark.parametrize(
    "calls", [_eps_calls, _eps_calls_full_path], ids=["fast_path", "full_check"]
)
def test_bad_epsilon_is_a_value_error_naming_op_and_epsilon(calls, eps):
    for op_name, call in calls(eps):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert f"opcore.ir.ops.{op_name}" in message and "'epsilon'" in message, message
        assert "finite number >= 0" in message, message


@pytest.mark.parametrize("eps", [0.0, 0, 1e-6, 1e-2, 1], ids=repr)
@pytest.mark.parametrize(
    "calls", [_eps_calls, _eps_calls_full_path], ids=["fast_path", "full_check"]
)
def test_valid_epsilon_passes_both_paths(calls, eps):
    for _, call in calls(eps):
        outputs = call()
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        assert all(torch.isfinite(o).all() for o in outputs)


def test_bad_epsilon_rejected_on_the_traced_path():
    with pytest.raises(ValueError, match=r"opcore.ir.ops.rms_norm: argument 'epsilon'"):
        torch.ops.opcore_ir.rms_norm(X, W, -1.0)
    with pytest.raises(ValueError, match=r"opcore.ir.ops.fused_add_rms_norm: argument 'epsilon'"):
        ops.fused_add_rms_norm.maybe_inplace(X.clone(), X.clone(), W, math.nan)


# --------------------------------------------------------------------------- arity
ARITY_CASES = [
    ("rms_norm", (X,)),
    ("rms_norm", (X, W, 1e-6, None, "extra")),
    ("fused_add_rms_norm", (X, X)),
    ("silu_and_mul", ()),
    ("gelu_and_mul", (X, "none", "extra")),
    ("rotary_embedding", (POS, X)),
    ("split_qkv_rmsnorm_rope", (QKV, None, None, 1e-6)),
]


@pytest.mark.parametrize(
    "op_name, args", ARITY_CASES, ids=[f"{c[0]}-{len(c[1])}" for c in ARITY_CASES]
)
def test_arity_errors_name_the_op(op_name, args):
    op = getattr(ops, op_name)
    for call in (op, op.validate):
        with pytest.raises(TypeError) as info:
            call(*args)
        message = str(info.value)
        assert message.startswith(f"opcore.ir.ops.{op_name}: "), message
        assert "_validate" not in message and "<lambda>" not in message, message
        assert f"it takes ({', '.join(op.param_names[:1])}" in message, message


def test_arity_errors_with_keywords_and_maybe_inplace():
    with pytest.raises(TypeError, match=r"^opcore.ir.ops.rms_norm: .*'weight'"):
        ops.rms_norm(X, epsilon=1e-6)
    with pytest.raises(TypeError, match=r"^opcore.ir.ops.rms_norm: .*'bogus'"):
        ops.rms_norm(X, W, 1e-6, bogus=1)
    with pytest.raises(TypeError, match=r"^opcore.ir.ops.fused_add_rms_norm: "):
        ops.fused_add_rms_norm.maybe_inplace(X.clone())


def test_type_errors_of_the_validator_are_kept():
    # Arguments that fit the parameters keep the validator's own message.
    with pytest.raises(TypeError, match=r"argument 'epsilon': expected a float"):
        ops.rms_norm(X, W, "1e-6")


# --------------------------------------------------------------------------- zero tokens
def _zero_token_cases():
    cache = build_cos_sin_cache(64, 100)
    empty = torch.zeros(0, dtype=torch.long)
    return [
        ("hidden", empty, torch.randn(0, 4 * 64), torch.randn(0, 2 * 64), cache),
        ("heads_dim", empty, torch.randn(0, 4, 64), torch.randn(0, 2, 64), cache),
        ("key_none", empty, torch.randn(0, 4 * 64), None, cache),
        (
            "batch_2x0",
            torch.zeros(2, 0, dtype=torch.long),
            torch.randn(2, 0, 128),
            torch.randn(2, 0, 64),
            cache,
        ),
        (
            "partial_rotary",
            empty,
            torch.randn(0, 2 * 64),
            torch.randn(0, 64),
            build_cos_sin_cache(32, 100),
        ),
    ]


def _check_empty(out, q, k):
    oq, ok = out
    assert oq.shape == q.shape and oq.dtype == q.dtype
    assert (ok is None) if k is None else (ok.shape == k.shape and ok.dtype == k.dtype)


@pytest.mark.parametrize(
    "name, pos, q, k, cache", _zero_token_cases(), ids=[c[0] for c in _zero_token_cases()]
)
def test_rotary_embedding_with_zero_tokens_every_provider(name, pos, q, k, cache):
    args = (pos, q, k, 64, cache, True)
    _check_empty(ops.rotary_embedding(*args), q, k)
    _check_empty(ops.rotary_embedding.native(*args), q, k)
    _check_empty(torch.ops.opcore_ir.rotary_embedding(*args), q, k)
    _check_empty(ops.rotary_embedding.maybe_inplace(*args), q, k)
    for provider, impl in ops.rotary_embedding.impls.items():
        if not impl.supported or (impl.supports_args is not None and not impl.supports_args(*args)):
            continue
        with ops.rotary_embedding.set_priority([provider]):
            _check_empty(ops.rotary_embedding(*args), q, k)
        _check_empty(impl.functional(*args), q, k)


ZERO_TOKENS_TRITON = """
import json
import torch
import opcore.kernels.triton  # registers the triton provider (the interpreter runs it here)
from opcore.ir import ops
from opcore.ir.rope import build_cos_sin_cache

cache = build_cos_sin_cache(64, 100)
pos = torch.zeros(0, dtype=torch.long)
results = {}
for layout, (q, k) in {
    "hidden": (torch.randn(0, 256), torch.randn(0, 128)),
    "heads_dim": (torch.randn(0, 4, 64), torch.randn(0, 2, 64)),
    "key_none": (torch.randn(0, 256), None),
}.items():
    args = (pos, q, k, 64, cache, True)
    impl = ops.rotary_embedding.impls["triton"]
    assert impl.supports_args(*args) is True, layout
    with ops.rotary_embedding.set_priority(["triton"]):
        assert ops.rotary_embedding.dispatch(*args).provider == "triton"
        outs = [ops.rotary_embedding(*args), impl.functional(*args),
                impl.impl_fn(pos, q.clone(), k, 64, cache, True)]
    results[layout] = [[list(o.shape) if o is not None else None for o in out] for out in outs]
print(json.dumps(results))
"""


def test_rotary_embedding_with_zero_tokens_triton_under_interpreter():
    pytest.importorskip("triton")
    proc = run_python(
        textwrap.dedent(ZERO_TOKENS_TRITON), env={"TRITON_INTERPRET": "1"}, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    assert results == {
        "hidden": [[[0, 256], [0, 128]]] * 3,
        "heads_dim": [[[0, 4, 64], [0, 2, 64]]] * 3,
        "key_none": [[[0, 256], None]] * 3,
    }
