"""The sample generators cover what providers get wrong, deterministically, and keep
layouts when moved."""

from __future__ import annotations

import torch

from opcore.ir import SampleInput, all_ops, ops


def _names(op, **kw):
    return [s.name for s in op.sample_inputs("cpu", torch.float32, **kw)]


def test_names_unique_and_full_extends_quick():
    for op in all_ops().values():
        quick, full = _names(op), _names(op, quick=False)
        assert len(quick) == len(set(quick)), op.name
        assert len(full) == len(set(full)) and set(quick) <= set(full) and len(full) > len(quick), (
            op.name
        )


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN (the fp8 ops' samples hold rows with NaN)."""
    if not a.is_floating_point():
        return torch.equal(a, b)
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
        a.nan_to_num(), b.nan_to_num()
    )


def test_samples_are_deterministic_and_cast_from_the_same_values():
    for op in all_ops().values():
        a = list(op.sample_inputs("cpu", torch.float32))
        b = list(op.sample_inputs("cpu", torch.float32))
        c = list(op.sample_inputs("cpu", torch.bfloat16))
        for sa, sb, sc in zip(a, b, c, strict=True):
            for (_, ta), (_, tb), (_, tc) in zip(
                sa.tensors(), sb.tensors(), sc.tensors(), strict=True
            ):
                assert _same(ta, tb), (op.name, sa.name)
                if ta.is_floating_point() and tc.dtype == torch.bfloat16:
                    assert _same(ta.to(torch.bfloat16), tc), (op.name, sa.name)


def _x_shapes(op, index=0):
    return [s.args[index] for s in op.sample_inputs()]


def test_norm_and_activation_coverage():
    for op in (ops.rms_norm, ops.fused_add_rms_norm, ops.silu_and_mul, ops.gelu_and_mul):
        xs = _x_shapes(op)
        assert any(x.shape[0] == 1 and x.dim() == 2 for x in xs), op.name  # 1 token
        assert {x.dim() for x in xs} >= {2, 3, 4}, op.name
        assert any(not x.is_contiguous() and x.stride(-1) == 1 for x in xs), op.name  # strided rows
        widths = {x.shape[-1] for x in xs}
        assert widths & {31, 33, 127, 129, 62, 66, 254, 258}, op.name  # around vector widths
        assert any(x.shape[-1] in (7, 251, 14, 422) for x in xs), op.name  # odd / prime
        assert any(bool((x == 0).all(dim=-1).any()) for x in xs), op.name  # zero rows
        assert any(x.abs().max() > 50 for x in xs), op.name  # large magnitudes
    norms = list(ops.rms_norm.sample_inputs())
    assert any(s.args[1] is None or s.kwargs.get("weight", 0) is None for s in norms)
    assert any(len(s.args) > 3 and s.args[3] is not None for s in norms)  # variance_size
    assert any(s.kwargs.get("approximate") == "tanh" for s in ops.gelu_and_mul.sample_inputs())


def test_rotary_coverage():
    samples = list(ops.rotary_embedding.sample_inputs())
    assert {s.args[5] for s in samples} == {True, False}  # both styles
    assert any(s.args[2] is None for s in samples)  # no key
    assert any(s.args[4].shape[1] < s.args[3] for s in samples)  # partial rotary
    assert any(s.args[1].dim() == 4 for s in samples) and any(s.args[1].dim() == 2 for s in samples)
    assert any(s.args[0].dtype == torch.int32 for s in samples)
    strided = [s for s in samples if not s.args[1].is_contiguous()]
    assert strided and all(
        s.args[1]._base is not None and s.args[1]._base is s.args[2]._base for s in strided
    )
    for s in samples:
        pos = s.args[0].reshape(-1)
        if s.name.startswith("expanded_positions"):  # one decode position broadcast (stride 0)
            assert 0 in s.args[0].stride() and pos.unique().numel() == 1
            continue
        assert pos.unique().numel() == pos.numel()  # distinct positions per token
    qkv = list(ops.split_qkv_rmsnorm_rope.sample_inputs())
    assert any(
        s.args[1] is not None and not torch.equal(s.args[1], s.args[2]) for s in qkv
    )  # distinct q/k weights
    assert any(not s.args[0].is_contiguous() for s in qkv)
    assert any(s.args[5].shape[1] < s.args[8] for s in qkv)


def test_moving_keeps_strides_offsets_and_shared_buffers():
    buf = torch.arange(60.0).reshape(5, 12)
    q, k = buf[:, :8], buf[:, 8:]
    moved = SampleInput("s", (q, k, 3)).to("meta")
    mq, mk, n = moved.args
    assert n == 3 and mq.device.type == "meta"
    assert (mq.shape, mq.stride(), mq.storage_offset()) == (q.shape, q.stride(), q.storage_offset())
    assert (mk.stride(), mk.storage_offset()) == (k.stride(), k.storage_offset())
    assert mq.untyped_storage()._cdata == mk.untyped_storage()._cdata
    copy = SampleInput("s", (q, k)).clone()
    assert torch.equal(copy.args[0], q) and copy.args[0].data_ptr() != q.data_ptr()
    assert copy.args[0].stride() == q.stride()
