"""opcore.ir: ops declared once by their native PyTorch function, computed by providers.

API summary::

    from opcore.ir import register_op, ops

    @register_op(allow_inplace=True)           # name = function name, ^[a-z_][a-z0-9_]*$
    def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None): ...

    @ops.rms_norm.register_impl("triton", supported=HAS_TRITON, supports_args=fn)
    def rms_norm(x, weight, epsilon, variance_size=None): ...   # same parameters as native

    ops.rms_norm(x, w, 1e-6)                   # validate, dispatch by priority, call
    ops.fused_add_rms_norm.maybe_inplace(...)  # caller donates the activations
    ops.rms_norm.dispatch(x, w, 1e-6).provider # the chosen Impl
    ops.rms_norm.impls["native"].impl_fn       # provider -> Impl(provider, impl_fn,
                                               #   supported, supports_args, inplace)
    with ops.rms_norm.set_priority(["triton", "native"]): ...
    print(ops.rms_norm.explain(x, w, 1e-6))    # who runs, why the others do not
    ops.rms_norm.effective_priority()          # ["triton", "native"]
    ops.rms_norm.decision()                    # the priority.Decision (why each provider)
    ops.rms_norm.sample_inputs("cuda", torch.bfloat16)   # named SampleInputs
    ops.rms_norm.tolerance(torch.bfloat16)     # (atol, rtol)
    ops.rms_norm.identity_hash("triton")       # for compile caches
    ops.rms_norm.impls["triton"].properties    # Properties(batch_invariant=..., ...)
    torch.ops.opcore_ir.rms_norm               # the op as torch.compile sees it
    from opcore.ir.ops import rms_norm         # the same IrOp, defined in ops/_norm.py
    opcore.ir.all_ops(); opcore.ir.info(config) # data for `opcore info`

Contracts:

- Priority: the user list (``set_priority`` block, else ``config.kernel.ir_op_priority``,
  which includes ``OPCORE_IR_OP_PRIORITY``), then the platform's
  ``get_default_ir_op_priority(config)``, then ``native`` if no listed provider accepts
  every argument; see `opcore.ir.priority`. ``OPCORE_LOG_DISPATCH=1`` logs each decision.
  ``set_priority`` and ``opcore.settings.set_current_config`` blocks are scoped to the thread
  or asyncio task (`opcore.scopes`) and may be left in any order; provider names are
  checked after the platform's kernels are loaded.
- Eager calls dispatch in Python; while torch traces (Dynamo, make_fx, torch.fx) a call is
  one ``torch.ops.opcore_ir.<name>`` node (``.maybe_inplace`` overload for donations).
- The default overload never mutates its inputs (in-place providers get clones of the
  activations: parameters whose name starts with ``x`` unless ``activations=`` says).
- Arguments are validated once per call, before dispatch, by the op's validator; providers
  receive validated input. Errors name the op and the argument.
- Tests register throw-away providers/ops with `opcore.testing.ir`.
"""

# Importing these registers the ops: the built-in ones and the collective ones.
from opcore.ir import (
    collective,  # noqa: F401
    ops,
)
from opcore.ir.info import info  # noqa: E402
from opcore.ir.op import (
    RESERVED_PROVIDERS,
    Impl,
    IrOp,
    all_ops,
    collective_ops,
    get_op,
    invalidate_caches,
    register_op,
)
from opcore.ir.priority import Decision, Explanation, PriorityWarning
from opcore.ir.samples import SampleInput
from opcore.platforms.kernels import ensure_kernels_loaded, kernel_load_errors
from opcore.properties import PROPERTY_NAMES, Properties

__all__ = [
    "PROPERTY_NAMES",
    "RESERVED_PROVIDERS",
    "Decision",
    "Explanation",
    "Impl",
    "IrOp",
    "PriorityWarning",
    "Properties",
    "SampleInput",
    "all_ops",
    "collective_ops",
    "ensure_kernels_loaded",
    "get_op",
    "info",
    "invalidate_caches",
    "kernel_load_errors",
    "ops",
    "register_op",
]
