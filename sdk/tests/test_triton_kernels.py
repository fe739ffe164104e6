"""Triton kernels (`opcore.kernels.triton`) against an independent float64 reference.

The kernels run under Triton's CPU interpreter on CPU tensors. The interpreter is chosen
when a kernel is decorated, so it must be on before `opcore.kernels.triton` is first
imported; since the rest of the suite shares this process, the collected test below
re-runs this file in a child pytest with ``TRITON_INTERPRET=1`` and fails with its output.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from opcore.testing.interpreter import UNDER_TRITON_INTERPRETER, rerun_under_triton_interpreter

INTERPRETED = UNDER_TRITON_INTERPRETER

if not INTERPRETED:

    def test_triton_kernels_under_interpreter():
        rerun_under_triton_interpreter(__file__)

    def test_without_triton_the_provider_is_registered_unsupported():
        # A child where `import triton` fails (simulated: sys.modules['triton'] = None).
        code = (
            "import sys; sys.modules['triton'] = None\n"
            "import torch, opcore.kernels.triton as kt\n"
            "from opcore.ir import ops\n"
            "assert kt.HAS_TRITON is False and kt.DEVICE_TYPES == frozenset()\n"
            "for name in ('rms_norm', 'fused_add_rms_norm', 'silu_and_mul', 'gelu_and_mul',\n"
            "             'rotary_embedding', 'split_qkv_rmsnorm_rope'):\n"
            "    impl = getattr(ops, name).impls['triton']\n"
            "    assert impl.supported is False, name\n"
            "x = torch.randn(2, 8)\n"
            "assert kt._register.supports_rms_norm(x, None, 1e-6) is False\n"
            "try:\n"
            "    ops.rms_norm.impls['triton'].impl_fn(x, None, 1e-6)\n"
            "except RuntimeError as e:\n"
            "    assert 'triton' in str(e) and 'rms_norm' in str(e)\n"
            "else:\n"
            "    raise AssertionError('no error')\n"
            "print('ok')\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]

    def test_launch_model_without_a_device_count_says_so():
        # No Triton driver here (no GPU, interpreter off): the launch model sizes for the
        # fitted device's multiprocessor count, and says so once, not silently.
        code = (
            "import logging; logging.basicConfig()\n"
            "from triton.runtime import driver\n"
            "try:\n"
            "    driver.active.get_current_device()\n"
            "    print('a driver'); raise SystemExit(0)\n"
            "except RuntimeError:\n"
            "    pass\n"
            "from opcore.kernels.triton import _launch\n"
            "print(_launch.multiprocessors(0), _launch.multiprocessors(0))\n"
            "print(*_launch.register_file(0), _launch.norm_resident_warps(0, True))\n"
            "print(_launch.norm_resident_warps(0, False))\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        if proc.stdout.strip() == "a driver":
            pytest.skip("this machine has a Triton driver: it reports the real count")
        assert proc.stdout.split() == ["132", "132", "65536", "32", "51", "32"]
        assert proc.stderr.count("no multiprocessor count for device 0") == 1, proc.stderr
        assert proc.stderr.count("no register file for device 0") == 1, proc.stderr

else:
    pytest.importorskip("triton")
    from opcore.kernels.triton import activation, norm, qk_norm_rope, rotary

    DTYPES = [torch.float32, torch.float16, torch.bfloat16]
    TOL = {
        torch.float32: (2e-5, 2e-5),
        torch.float16: (2e-3, 2e-3),
        torch.bfloat16: (1.6e-2, 1.6e-2),
    }

    def check(out, ref, dtype):
        assert out.dtype == dtype
        atol, rtol = TOL[dtype]
        torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)

    def launch_option(monkeypatch, name):
        """The values of the launch option ``name`` the launchers pass to `_bound.launch`,
        in call order (the list fills as they launch)."""
        from opcore.kernels.triton import _bound

        seen, real = [], _bound.launch

        def spy(kernel, grid, *args, **options):
            seen.append(options[name])
            return real(kernel, grid, *args, **options)

        monkeypatch.setattr(_bound, "launch", spy)
        return seen

    # ---- float64 references from the op semantics (docs/design.md#op-semantics), not kernels ----
    def ref_rms(x, w, eps, var_size=None):
        xd = x.double()
        n = xd.shape[-1] if var_size is None else var_size
        var = xd[..., :n].pow(2).mean(-1, keepdim=True)
        y = xd / torch.sqrt(var + eps)
        return y * w.double() if w is not None else y

    def ref_rope(positions, t, head_size, cache, is_neox):
        n_tok = positions.numel()
        x = t.double().reshape(n_tok, -1, head_size).clone()
        rot = cache.shape[-1]
        half = rot // 2
        c = cache.double()[positions.reshape(-1)]
        cos, sin = c[:, None, :half], c[:, None, half:]
        if is_neox:
            a, b = x[..., :half].clone(), x[..., half:rot].clone()
            x[..., :half], x[..., half:rot] = a * cos - b * sin, b * cos + a * sin
        else:
            a, b = x[..., 0:rot:2].clone(), x[..., 1:rot:2].clone()
            x[..., 0:rot:2], x[..., 1:rot:2] = a * cos - b * sin, b * cos + a * sin
        return x.reshape(t.shape)

    def make_cache(max_pos, rot, dtype=torch.float32):
        inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
        f = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
        return torch.cat([f.cos(), f.sin()], dim=-1).to(dtype)

    def strided_rows(rows, n, dtype, pad=24):
        """A [rows, n] view with row stride n + pad: a column slice of a wider buffer."""
        buf = torch.randn(rows, n + pad, dtype=dtype)
        return buf[:, 5 : 5 + n] if pad >= 5 else buf[:, :n]

    # ------------------------------------------------------------------ rms_norm
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("shape", [(1, 64), (7, 100), (3, 5, 256), (2, 3, 2, 48), (9, 1000)])
    def test_rms_norm(dtype, shape):
        x = torch.randn(shape, dtype=dtype)
        w = torch.randn(shape[-1], dtype=dtype)
        check(norm.rms_norm(x, w, 1e-6), ref_rms(x, w, 1e-6), dtype)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_rms_norm_strided_no_weight_variance_size(dtype):
        x = strided_rows(6, 96, dtype)
        assert not x.is_contiguous()
        check(norm.rms_norm(x, None, 1e-5), ref_rms(x, None, 1e-5), dtype)
        w = torch.randn(96, dtype=torch.float32)
        check(norm.rms_norm(x, w, 1e-5, 40), ref_rms(x, w, 1e-5, 40), dtype)

    def test_rms_norm_long_rows_two_pass():
        from opcore.kernels.triton import _launch

        n = _launch.MAX_FUSED_COLS + 37
        x = torch.randn(2, n, dtype=torch.bfloat16)
        w = torch.randn(n, dtype=torch.bfloat16)
        assert not _launch.row_params(2, n)[2]
        check(norm.rms_norm(x, w, 1e-6, 5000), ref_rms(x, w, 1e-6, 5000), torch.bfloat16)

    @pytest.mark.parametrize("residual", [False, True])
    @pytest.mark.parametrize("variance_size", [None, 60])
    @pytest.mark.parametrize("n, chunk", [(100, None), (200, 64)])  # one pass; two passes
    def test_rms_norm_masks_the_squares_only_for_a_partial_variance(
        monkeypatch, residual, variance_size, n, chunk
    ):
        # The row's lanes past n_cols load as zeros, so a variance over the whole row needs
        # no mask on its squares (PARTIAL_VARIANCE off, the same bits); one over the first
        # variance_size columns keeps it.
        if chunk is not None:
            cfg = {"BLOCK_N": chunk, "ROWS": 1, "num_warps": 2}
            monkeypatch.setattr(norm, "launch_config", lambda *a: cfg)
        passed = launch_option(monkeypatch, "PARTIAL_VARIANCE")
        x, r = torch.randn(5, n, dtype=torch.bfloat16), torch.randn(5, n, dtype=torch.bfloat16)
        w = torch.randn(n, dtype=torch.bfloat16)
        if residual:
            out, res = norm.fused_add_rms_norm(x, r, w, 1e-6, variance_size)
            s = (x.double() + r.double()).to(torch.bfloat16)
            check(res, s.double(), torch.bfloat16)
            check(out, ref_rms(s, w, 1e-6, variance_size), torch.bfloat16)
        else:
            check(norm.rms_norm(x, w, 1e-6, variance_size), ref_rms(x, w, 1e-6, variance_size),
                  torch.bfloat16)  # fmt: skip
        assert passed == [variance_size is not None]
        if variance_size is None:  # the mask changes no bit where it is not needed
            unmasked = norm.rms_norm(x, w, 1e-6)
            single = chunk is None
            forced = torch.empty_like(x)
            norm._rms_norm_kernel[(5,)](
                x, n, x, n, w, forced, n, forced, n, 5, n, n, 1e-6, HAS_RESIDUAL=False,
                HAS_WEIGHT=True, BLOCK_N=128 if single else chunk, ROWS=1, SINGLE_PASS=single,
                N_CHUNKS=1 if single else 4, PARTIAL_VARIANCE=True, num_warps=2,
            )  # fmt: skip
            assert torch.equal(unmasked, forced)

    def test_rms_norm_leaves_input_alone():
        x = torch.randn(4, 64)
        before = x.clone()
        out = norm.rms_norm(x, None, 1e-6)
        assert out.data_ptr() != x.data_ptr()
        assert torch.equal(x, before)

    # ------------------------------------------------------------------ fused_add_rms_norm
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("shape", [(1, 128), (5, 72), (2, 3, 200)])
    def test_fused_add_rms_norm(dtype, shape):
        x, r = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
        w = torch.randn(shape[-1], dtype=dtype)
        x0, r0 = x.clone(), r.clone()
        out, res = norm.fused_add_rms_norm(x, r, w, 1e-6)
        s = (x.double() + r.double()).to(dtype)
        check(res, s.double(), dtype)
        check(out, ref_rms(s, w, 1e-6), dtype)
        assert torch.equal(x, x0) and torch.equal(r, r0)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_fused_add_rms_norm_inplace_strided(dtype):
        x = strided_rows(7, 136, dtype)
        r = strided_rows(7, 136, dtype, pad=8)
        w = torch.randn(136, dtype=dtype)
        s = (x.double() + r.double()).to(dtype)
        ref = ref_rms(s, w, 1e-6, 100)
        buf_before = x._base.clone()
        out, res = norm.fused_add_rms_norm_inplace(x, r, w, 1e-6, 100)
        assert out is x and res is r
        check(x, ref, dtype)
        check(r, s.double(), dtype)
        # the columns around the slice are untouched
        assert torch.equal(x._base[:, :5], buf_before[:, :5])
        assert torch.equal(x._base[:, 141:], buf_before[:, 141:])

    # ------------------------------------------------------------------ activations
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("shape", [(1, 64), (5, 2 * 37), (2, 3, 2 * 300)])
    def test_silu_and_mul(dtype, shape):
        x = torch.randn(shape, dtype=dtype) * 3
        d = shape[-1] // 2
        g, u = x.double()[..., :d], x.double()[..., d:]
        check(activation.silu_and_mul(x), g * torch.sigmoid(g) * u, dtype)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("approximate", ["none", "tanh"])
    def test_gelu_and_mul(dtype, approximate):
        x = strided_rows(6, 2 * 45, dtype) * 3
        d = 45
        g, u = x.double()[..., :d], x.double()[..., d:]
        ref = torch.nn.functional.gelu(g, approximate=approximate) * u
        check(activation.gelu_and_mul(x, approximate), ref, dtype)

    def test_gelu_and_mul_rejects_unknown_approximation():
        with pytest.raises(ValueError, match="approximate"):
            activation.gelu_and_mul(torch.randn(2, 8), "sigmoid")

    # the launch model's spans: three even 512 tiles, two rows each; three 1024 tiles, the
    # last masked (3000 = 2**3 * 375: no even tile)
    @pytest.mark.parametrize("d, tile", [(1536, (512, 2)), (3000, (1024, 1))])
    def test_act_and_mul_rows_wider_than_the_tile(d, tile):
        from opcore.kernels.triton import _launch

        x = torch.randn(3, 2 * d, dtype=torch.bfloat16) * 3
        block_c, rows, _, _ = _launch.gated_params(3, d, _launch.multiprocessors())
        assert (block_c, rows) == tile and d > block_c
        g, u = x.double()[..., :d], x.double()[..., d:]
        check(activation.silu_and_mul(x), g * torch.sigmoid(g) * u, torch.bfloat16)
        ref = torch.nn.functional.gelu(g, approximate="tanh") * u
        check(activation.gelu_and_mul(x, "tanh"), ref, torch.bfloat16)

    @pytest.mark.parametrize("cols_first", [0, 1])
    @pytest.mark.parametrize("rows, block_c", [(1, 512), (4, 512), (2, 1024)])
    def test_act_and_mul_every_tile_order(monkeypatch, cols_first, rows, block_c):
        # A tuned configuration (the launch space's COLS_FIRST: a 1-D grid walking columns
        # first) on 7 rows x 1000 columns: row blocks and column tiles both end masked.
        from opcore.kernels.triton import spaces

        cfg = {"BLOCK_C": block_c, "ROWS": rows, "num_warps": 2, "COLS_FIRST": cols_first}
        assert spaces.ACT_SPACE.validate(cfg, (1000,)) is None
        monkeypatch.setattr(activation, "launch_config", lambda *a: cfg)
        x = torch.randn(7, 2 * 1000, dtype=torch.bfloat16) * 3
        g, u = x.double()[..., :1000], x.double()[..., 1000:]
        check(activation.silu_and_mul(x), g * torch.sigmoid(g) * u, torch.bfloat16)
        ref = torch.nn.functional.gelu(g, approximate="tanh") * u
        check(activation.gelu_and_mul(x, "tanh"), ref, torch.bfloat16)

    @pytest.mark.parametrize("cols_first", [0, 1])
    @pytest.mark.parametrize(
        "t, d, tile, even",
        [(8, 1024, (512, 4), True), (7, 1024, (512, 4), False), (8, 1000, (512, 4), False),
         (1, 13824, (512, 1), True)],
    )  # fmt: skip
    def test_act_and_mul_drops_the_masks_only_where_the_tiles_cover_the_output(
        monkeypatch, cols_first, t, d, tile, even
    ):
        # EVEN: d a multiple of BLOCK_C and the rows of ROWS, the loads and stores unmasked;
        # a row block or a column tile that runs past the output keeps them.
        from opcore.kernels.triton import spaces

        cfg = {"BLOCK_C": tile[0], "ROWS": tile[1], "num_warps": 2, "COLS_FIRST": cols_first}
        assert spaces.ACT_SPACE.validate(cfg, (d,)) is None
        monkeypatch.setattr(activation, "launch_config", lambda *a: cfg)
        passed = launch_option(monkeypatch, "EVEN")
        x = torch.randn(t, 2 * d, dtype=torch.bfloat16) * 3
        g, u = x.double()[..., :d], x.double()[..., d:]
        check(activation.silu_and_mul(x), g * torch.sigmoid(g) * u, torch.bfloat16)
        ref = torch.nn.functional.gelu(g, approximate="none") * u
        check(activation.gelu_and_mul(x), ref, torch.bfloat16)
        assert passed == [even, even]

    def test_triton_identity_covers_the_launch_helpers_and_spaces():
        # A tuning table's configuration means what _launch, _support and spaces say: an
        # edit there must change the providers' identity (the table then goes stale).
        from opcore.ir import identity, ops
        from opcore.kernels.triton import _launch, _support, spaces

        for op in ("rms_norm", "silu_and_mul", "rotary_embedding", "scaled_fp8_quant"):
            impl = getattr(ops, op).impls["triton"]
            assert {_launch, _support, spaces} <= set(impl.identity_sources), op
            own = identity.hash_source(impl.impl_fn, op_name=op, provider="triton")
            assert impl.identity_hash() != own

    def test_an_edit_to_a_shared_kernel_helper_changes_each_caller_identity(tmp_path):
        # The fused QKV split calls rotary.py's rotation: an edit there (the fma fix) left
        # the split's identity, so the H200 table's split entries would have applied as if
        # measured on today's kernel. A copy of the package with rotary.py edited must give
        # the split (and rotary) new identities and leave rms_norm's alone.
        import json
        import pathlib
        import shutil

        import opcore

        src = pathlib.Path(opcore.__file__).parent
        probe = (
            "import json, opcore.kernels.triton; from opcore.ir import ops; "
            "print(json.dumps({o: getattr(ops, o).identity_hash('triton') for o in "
            "('split_qkv_rmsnorm_rope', 'rotary_embedding', 'rms_norm')}))"
        )

        def identities(root):
            env = {**os.environ, "PYTHONPATH": str(root), "TRITON_INTERPRET": "1"}
            out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=root,
                                 capture_output=True, text=True, timeout=300)  # fmt: skip
            assert out.returncode == 0, out.stderr[-3000:]
            return json.loads(out.stdout.splitlines()[-1])

        copy = tmp_path / "opcore"
        shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
        before = identities(tmp_path)
        rotary = copy / "kernels" / "triton" / "rotary.py"
        rotary.write_text(rotary.read_text() + "\n# an edit\n")
        after = identities(tmp_path)
        assert after["rms_norm"] == before["rms_norm"]
        assert after["rotary_embedding"] != before["rotary_embedding"]
        assert after["split_qkv_rmsnorm_rope"] != before["split_qkv_rmsnorm_rope"]

    def test_cols_first_is_searched_only_where_there_are_many_row_blocks():
        from opcore.kernels.triton import spaces

        many = spaces.act_candidates(spaces.COLS_FIRST_MIN_TOKENS, (14336,))
        few = spaces.act_candidates(32, (14336,))
        assert {c["COLS_FIRST"] for c in many} == {0, 1} and {c["COLS_FIRST"] for c in few} == {0}
        assert spaces.ACT_SPACE.validate({**many[0], "COLS_FIRST": 2}, (14336,))

    # ------------------------------------------------------------------ launch parameters
    def test_column_tile_divides_the_width_when_it_can():
        from opcore.kernels.triton import _launch

        ew = _launch.elementwise_params
        assert ew(32768, 14336) == (2048, 2, 8)  # 7 full tiles, not 3.5 of 4096
        assert ew(32768, 28672) == (4096, 1, 8)  # 4096 divides it already
        assert ew(32768, 13824) == (512, 8, 8)  # 2**9 * 27
        assert ew(32768, 11008) == (4096, 1, 8)  # 2**8 * 43: below 512, plain tile
        assert ew(32768, 300) == (512, 8, 8)  # one tile per row, as before
        assert ew(1, 14336) == (512, 1, 2)  # few rows: small tiles, still even
        assert _launch.even_tile(6000, 4096) == 4096 and _launch.even_tile(3000, 4096) == 4096

    def test_norm_weight_first_only_while_every_program_is_resident():
        from opcore.kernels.triton import _launch

        first = _launch.norm_weight_first
        # 16 warps a row (5120-8192 columns): 32 resident warps a multiprocessor hold two
        # rows, so 512 rows run in two waves (where the first order lost 5-10 %), 264 in one
        assert first(264, 1, 16, 132) and not first(265, 1, 16, 132)
        assert not first(512, 1, 16, 132) and first(512, 1, 8, 132)
        assert first(132, 1, 32, 132) and not first(133, 1, 32, 132)
        # a table's launch of several rows a program counts programs, not rows
        assert first(512, 2, 16, 132)
        # and the launcher follows it: at 512 x 7168 the row launch keeps the weight after
        block_n, rows, _single, warps = _launch.row_params(512, 7168, 132)
        assert (block_n, rows, warps) == (8192, 1, 16) and not first(512, rows, warps, 132)

    def test_norm_weight_first_counts_the_registers_of_the_loads_the_launch_compiles():
        from opcore.kernels.triton import _launch

        first = _launch.norm_weight_first
        # 16-byte vector loads (16-bit rows, sizes and strides multiples of 16) take at most
        # 40 registers a thread on sm_90, so the fitted device's 65,536 hold 51 warps: three
        # programs of 16, where scalar loads (64 registers: 32 warps) hold two
        vector = _launch.norm_resident_warps(0, vector_loads=True)
        scalar = _launch.norm_resident_warps(0, vector_loads=False)
        assert (
            (vector, scalar)
            == (51, 32)
            == (
                _launch.REFERENCE_REGISTERS // (40 * 32),
                _launch.NORM_RESIDENT_WARPS_PER_SM,
            )
        )
        assert first(396, 1, 16, 132, vector) and not first(397, 1, 16, 132, vector)
        assert not first(512, 1, 16, 132, vector)  # two waves: the order that lost 5-10 %
        assert first(132, 1, 32, 132, vector) and not first(133, 1, 32, 132, vector)
        assert _launch.register_file(0) == (65536, 32)  # the interpreter: the fitted device
        loads = _launch.norm_vector_loads
        assert loads(2, 7168, 7168, 0, 7168, 0) and loads(2, 2304, 4608)
        assert not loads(4, 7168, 7168) and not loads(2, 7168, 7170) and not loads(2, 7160)

    @pytest.mark.parametrize("case", ["vector", "strided", "fp32"])
    def test_norm_launch_takes_the_weight_first_as_far_as_its_loads_allow(monkeypatch, case):
        # 384 rows of 7168 (16 warps a row) are three a multiprocessor on 132: resident at
        # once on vector loads, not on scalar ones (a row stride that is not a multiple of
        # 16, or fp32 rows).
        from opcore.kernels.triton import _bound

        launches = []
        real = _bound.launch

        def record(kernel, grid, *args, **options):
            launches.append(options)
            if case == "vector":  # run one for real: the launch still computes the norm
                real(kernel, grid, *args, **options)

        monkeypatch.setattr(_bound, "launch", record)
        dtype = torch.float32 if case == "fp32" else torch.bfloat16
        width = 7170 if case == "strided" else 7168
        x = torch.randn(384, width, dtype=dtype)[:, :7168]
        w = torch.randn(7168, dtype=dtype)
        out = norm.rms_norm(x, w, 1e-6)
        (options,) = launches
        assert options["num_warps"] == 16 and options["ROWS"] == 1
        assert options["WEIGHT_FIRST"] is (case == "vector")
        if case == "vector":
            check(out, ref_rms(x, w, 1e-6), torch.bfloat16)

    def test_norm_warps_by_row_length():
        from opcore.kernels.triton import _launch

        warps = {n: _launch.row_params(32768, n)[3] for n in (1024, 4096, 5120, 8192, 16384, 20000)}
        assert warps == {1024: 8, 4096: 8, 5120: 16, 8192: 16, 16384: 16, 20000: 8}

    def test_launch_model_few_rows_take_one_row_with_the_weight_loaded_first():
        from opcore.kernels.triton import _launch

        rp = _launch.row_params
        # at most LATENCY_ROWS_PER_SM rows per multiprocessor: one row a program, about 16
        # elements a thread on at least 4 warps (8 a thread below), the weight loaded first
        assert rp(1, 4096, 132) == (4096, 1, True, 8)
        assert rp(528, 7168, 132) == (8192, 1, True, 16)
        assert rp(16, 1024, 132) == (1024, 1, True, 4)
        assert rp(1, 16384, 132) == (16384, 1, True, 32) and rp(1, 128, 132)[3] == 1
        first = _launch.norm_weight_first
        assert first(528, 1, 8, 132) and not first(529, 1, 8, 132)
        # past it, the bandwidth rule: short rows packed several to a program, weight after
        assert rp(529, 7168, 132) == (8192, 1, True, 16)
        assert rp(32768, 1024, 132)[:2] == (1024, 4)
        # the regime follows the device's multiprocessor count, not a fixed number
        assert rp(100, 1024, 8) == (1024, 4, True, 8) and rp(100, 1024, 132) == (1024, 1, True, 4)
        assert not first(100, 1, 4, 8) and first(100, 1, 4, 132)
        assert rp(2, _launch.MAX_FUSED_COLS + 1, 132)[2] is False
        # the fp8 norm-quant rows keep about 8 elements a thread with few rows (their kernels
        # load the weight after the reduction) and 32 with many
        assert _launch.quant_row_params(1, 4096, 132) == (4096, 1, True, 16)
        assert _launch.quant_row_params(4096, 4096, 132) == (4096, 1, True, 4)

    def test_launch_model_gated_activations():
        from opcore.kernels.triton import _launch

        gp = _launch.gated_params
        # decode sizes: 1024-element spans on 8 warps, 2-D grid
        assert gp(1, 14336, 132) == (1024, 1, 8, 0)
        assert gp(16, 18944, 132) == (512, 2, 8, 0)  # 2**9 * 37: the even 512 tile, 2 rows
        # many spans: 2048-element tiles walked columns first, 8 warps
        assert gp(16384, 14336, 132) == (1024, 2, 8, 1)
        assert gp(4096, 13824, 132) == (512, 4, 8, 1)
        assert gp(4096, 11008, 132) == (1024, 2, 8, 1)  # 2**8 * 43: the plain tile, masked
        assert gp(64, 300, 132) == (512, 2, 8, 0)  # rows narrower than a span share it
        # a smaller device leaves the latency regime sooner
        assert gp(16, 14336, 132)[3] == 0 and gp(16, 14336, 8)[3] == 1

    def test_launch_model_quant_rows_take_fewer_warps_with_many_rows():
        from opcore.kernels.triton import _launch

        qp = _launch.quant_row_params
        assert qp(32768, 4096, 132) == (4096, 1, True, 4)
        assert qp(32768, 1024, 132) == (1024, 1, True, 1)
        # few rows: one row on about 8 elements a thread (the norms take 16 with the weight
        # loaded first; these kernels load it after the reduction)
        assert qp(8, 4096, 132) == (4096, 1, True, 16)
        assert qp(4, 20000, 132) == _launch.row_params(4, 20000, 132)  # two-pass: the same

    def test_multiprocessors_under_the_interpreter_is_the_reference_figure():
        from opcore.kernels.triton import _launch

        assert _launch.multiprocessors() == _launch.REFERENCE_SMS
        assert _launch.multiprocessors(0) == _launch.REFERENCE_SMS

    @pytest.mark.parametrize("n", [96, 1000])  # rows packed 8 and 4 to a program
    def test_norm_default_launch_with_many_rows_per_multiprocessor(monkeypatch, n):
        # With one multiprocessor, 13 rows are past the few-rows regime: the bandwidth
        # rule (short rows packed several to a program, the last program partly masked).
        from opcore.kernels.triton import _launch

        monkeypatch.setattr(_launch, "multiprocessors", lambda index=None: 1)
        block_n, rows, single, _ = _launch.row_params(13, n, 1)
        assert single and rows == (8 if n == 96 else 4) and block_n >= n
        x = torch.randn(13, n, dtype=torch.bfloat16)
        r = torch.randn(13, n, dtype=torch.bfloat16)
        w = torch.randn(n, dtype=torch.bfloat16)
        check(norm.rms_norm(x, w, 1e-6), ref_rms(x, w, 1e-6), torch.bfloat16)
        out, res = norm.fused_add_rms_norm(x, r, w, 1e-6)
        s = (x.double() + r.double()).to(torch.bfloat16)
        check(res, s.double(), torch.bfloat16)
        check(out, ref_rms(s, w, 1e-6), torch.bfloat16)

    @pytest.mark.parametrize("approx", [None, "tanh", "none"])
    def test_gated_default_launch_on_a_small_device_walks_columns_first(monkeypatch, approx):
        # With one multiprocessor, 7 rows x 1000 columns are past the latency regime: the
        # default (untuned) launch takes the columns-first tiles, row blocks masked.
        from opcore.kernels.triton import _launch

        monkeypatch.setattr(_launch, "multiprocessors", lambda index=None: 1)
        assert _launch.gated_params(7, 1000, 1) == (1024, 2, 8, 1)
        x = torch.randn(7, 2 * 1000, dtype=torch.bfloat16) * 3
        g, u = x.double()[..., :1000], x.double()[..., 1000:]
        if approx is None:
            check(activation.silu_and_mul(x), g * torch.sigmoid(g) * u, torch.bfloat16)
        else:
            ref = torch.nn.functional.gelu(g, approximate=approx) * u
            check(activation.gelu_and_mul(x, approx), ref, torch.bfloat16)

    def test_token_head_params():
        from opcore.kernels.triton import _launch

        thp = _launch.token_head_params
        # as many tokens as multiprocessors or more: one program per token holding every q
        # and k head, about 1024 elements of real heads per warp
        assert thp(32768, 32, 8, 128, 132) == (1, 32, 8, 4)  # 5120 elements
        assert thp(32768, 64, 8, 128, 132) == (1, 64, 8, 8)  # 9216
        assert thp(32768, 32, 0, 128, 132) == (1, 32, 1, 4)  # key=None
        assert thp(256, 32, 8, 128, 132) == (1, 32, 8, 4)
        # fewer: heads split in proportion (one cos/sin load per program) until about one
        # program per multiprocessor, about 128 elements of the padded tile per warp
        assert thp(1, 32, 8, 128, 132) == (8, 4, 1, 4)  # 5 heads x 128
        assert thp(2, 28, 4, 128, 132) == (4, 8, 1, 8)  # 9 padded heads x 128
        # the threshold is the device's: 256 tokens on 1024 multiprocessors split 4 ways
        assert thp(256, 32, 8, 128, 1024) == (4, 8, 2, 8)
        # the count defaults to REFERENCE_SMS
        assert (
            thp(100, 32, 8, 128)
            == thp(100, 32, 8, 128, _launch.REFERENCE_SMS)
            != thp(100, 32, 8, 128, 16)
        )
        for args in [
            (t, a, b, c, sms)
            for t in (1, 7, 300, 5000)
            for a in (1, 3, 28, 64)
            for b in (0, 1, 5, 8)
            for c in (16, 128, 256)
            for sms in (8, 132)
        ]:
            programs, ba, bb, w = thp(*args)
            t, a, b, _, _ = args
            assert programs * ba >= a and programs * bb >= b, args  # every head covered
            assert w & (w - 1) == 0 and 1 <= w <= 8, args  # a power of two

    def test_split_qkv_params_warps_per_regime():
        from opcore.kernels.triton import _launch

        sqp = _launch.split_qkv_params
        # heads split (fewer tokens than multiprocessors): one warp per program
        assert sqp(1, 32, 8, 128, 132) == (8, 4, 1, 1)
        assert sqp(16, 28, 4, 128, 132) == (4, 8, 1, 1)
        # up to 4 tokens per multiprocessor: token_head_params' warps
        for args in [(256, 32, 8, 128, 132), (528, 64, 8, 128, 132), (200, 8, 1, 128, 132)]:
            assert sqp(*args) == _launch.token_head_params(*args), args
        # more: about 2048 padded elements per warp, never below 2
        assert sqp(32768, 32, 8, 128, 132) == (1, 32, 8, 2)  # 5120 elements
        assert sqp(32768, 64, 8, 128, 132) == (1, 64, 8, 4)  # 9216 elements
        assert sqp(32768, 8, 1, 128, 132) == (1, 8, 1, 2)
        assert sqp(529, 32, 8, 128, 132) == (1, 32, 8, 2)

    # ------------------------------------------------------------------ rotary
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("is_neox", [True, False])
    @pytest.mark.parametrize("rot", [64, 32])  # full and partial rotary of head_size 64
    def test_rotary_embedding_qkv_slices(dtype, is_neox, rot):
        n_tok, hq, hk, d = 5, 4, 2, 64
        qkv = torch.randn(n_tok, (hq + 2 * hk) * d, dtype=dtype)
        q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d]
        positions = torch.tensor([7, 0, 31, 3, 3])
        cache = make_cache(40, rot)
        qkv0 = qkv.clone()
        qo, ko = rotary.rotary_embedding(positions, q, k, d, cache, is_neox)
        assert torch.equal(qkv, qkv0)
        check(qo, ref_rope(positions, q, d, cache, is_neox), dtype)
        check(ko, ref_rope(positions, k, d, cache, is_neox), dtype)
        rq, rk = (
            ref_rope(positions, q, d, cache, is_neox),
            ref_rope(positions, k, d, cache, is_neox),
        )
        qi, ki = rotary.rotary_embedding_inplace(positions, q, k, d, cache, is_neox)
        assert qi is q and ki is k
        check(q, rq, dtype)
        check(k, rk, dtype)
        assert torch.equal(qkv[:, (hq + hk) * d :], qkv0[:, (hq + hk) * d :])  # v untouched

    # (q heads, k heads, tokens) -> one program per token with 8 q + 1 k head; a last
    # program without k heads (8/5); a last program without q heads (5/4)
    HEAD_SPLITS = [(8, 1, 3), (8, 5, 2), (5, 4, 2)]

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    @pytest.mark.parametrize("is_neox", [True, False])
    @pytest.mark.parametrize("hq,hk,n_tok", HEAD_SPLITS)
    def test_rotary_embedding_head_splits(dtype, is_neox, hq, hk, n_tok):
        d, rot = 48, 32
        q = torch.randn(n_tok, hq * d, dtype=dtype)
        k = torch.randn(n_tok, hk, d, dtype=dtype)
        positions = torch.randint(0, 16, (n_tok,))
        cache = make_cache(16, rot)
        qo, ko = rotary.rotary_embedding(positions, q, k, d, cache, is_neox)
        check(qo, ref_rope(positions, q, d, cache, is_neox), dtype)
        check(ko, ref_rope(positions, k, d, cache, is_neox), dtype)
        rq, rk = (
            ref_rope(positions, q, d, cache, is_neox),
            ref_rope(positions, k, d, cache, is_neox),
        )
        rotary.rotary_embedding_inplace(positions, q, k, d, cache, is_neox)
        check(q, rq, dtype)
        check(k, rk, dtype)

    @pytest.mark.parametrize("is_neox", [True, False])
    def test_rotary_embedding_4d_heads_layout_no_key(is_neox):
        b, s, h, d = 2, 3, 3, 48
        q = torch.randn(b, s, h, d, dtype=torch.bfloat16)
        positions = torch.randint(0, 20, (b, s))
        cache = make_cache(20, 32, torch.bfloat16)
        qo, ko = rotary.rotary_embedding(positions, q, None, d, cache, is_neox)
        assert ko is None and qo.shape == q.shape
        check(qo, ref_rope(positions, q, d, cache, is_neox), torch.bfloat16)

    # Positions that are a strided or expanded view (a decode step's one position broadcast
    # over the batch): the kernels index positions as a flat contiguous array, so the
    # launchers must hand them one. Before the fix they read past the view (stride 2 here:
    # every other token took the filler value 100; on a GPU, an expanded view read out of
    # bounds).
    def strided_positions():
        base = torch.tensor([3, 100, 5, 100, 9, 100, 2, 100])
        return {"strided": base[::2], "expanded": torch.tensor([[6]]).expand(4, 1).reshape(4)}

    @pytest.mark.parametrize("kind", ["strided", "expanded"])
    def test_rotary_embedding_non_contiguous_positions(kind):
        positions = strided_positions()[kind]
        d = 32
        q = torch.randn(4, 2 * d)
        k = torch.randn(4, d)
        cache = make_cache(16, d)
        qo, ko = rotary.rotary_embedding(positions, q, k, d, cache, True)
        check(qo, ref_rope(positions.contiguous(), q, d, cache, True), torch.float32)
        check(ko, ref_rope(positions.contiguous(), k, d, cache, True), torch.float32)

    @pytest.mark.parametrize("kind", ["strided", "expanded"])
    def test_split_qkv_rmsnorm_rope_non_contiguous_positions(kind):
        positions = strided_positions()[kind]
        h, kv, d = 2, 1, 32
        qkv = torch.randn(4, (h + 2 * kv) * d)
        cache = make_cache(16, d)
        q, k, v = qk_norm_rope.split_qkv_rmsnorm_rope(
            qkv, None, None, 1e-6, positions, cache, h, kv, d, True
        )
        rq, rk, rv = ref_split(qkv, None, None, 1e-6, positions.contiguous(), cache, h, kv, d, True)
        check(q, rq, torch.float32)
        check(k, rk, torch.float32)

    # ------------------------------------------------------------------ fused split
    def ref_split(qkv, qw, kw, eps, positions, cache, h, kv, d, is_neox):
        q, k, v = qkv.split([h * d, kv * d, kv * d], dim=-1)
        qn = ref_rms(q.reshape(-1, h, d), qw, eps).reshape(q.shape)
        kn = ref_rms(k.reshape(-1, kv, d), kw, eps).reshape(k.shape)
        return (
            ref_rope(positions, qn, d, cache, is_neox),
            ref_rope(positions, kn, d, cache, is_neox),
            v.double(),
        )

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("is_neox", [True, False])
    @pytest.mark.parametrize("h,kv,d,rot", [(4, 2, 64, 64), (3, 1, 80, 32)])
    def test_split_qkv_rmsnorm_rope(dtype, is_neox, h, kv, d, rot):
        n_tok = 5
        buf = torch.randn(n_tok, (h + 2 * kv) * d + 16, dtype=dtype)
        qkv = buf[:, 16:]  # row-strided view
        qw = torch.rand(d, dtype=dtype) + 0.5
        kw = torch.rand(d, dtype=dtype) + 0.5
        positions = torch.tensor([9, 1, 0, 33, 2])
        cache = make_cache(40, rot)
        buf0 = buf.clone()
        q, k, v = qk_norm_rope.split_qkv_rmsnorm_rope(
            qkv, qw, kw, 1e-6, positions, cache, h, kv, d, is_neox
        )
        rq, rk, rv = ref_split(qkv, qw, kw, 1e-6, positions, cache, h, kv, d, is_neox)
        assert torch.equal(buf, buf0)
        # the norm rounds nothing before the rotation; allow one more ulp of slack for bf16
        check(q, rq, dtype)
        check(k, rk, dtype)
        assert torch.equal(v, qkv[:, (h + kv) * d :])
        assert q.shape == (n_tok, h * d) and v.is_contiguous()

    @pytest.mark.parametrize("is_neox", [True, False])
    @pytest.mark.parametrize("h,kv,n_tok", HEAD_SPLITS)
    def test_split_qkv_rmsnorm_rope_head_splits(is_neox, h, kv, n_tok):
        d, rot, dtype = 48, 32, torch.bfloat16
        qkv = torch.randn(n_tok, (h + 2 * kv) * d, dtype=dtype)
        qw, kw = torch.rand(d, dtype=dtype) + 0.5, torch.rand(d, dtype=dtype) + 0.5
        positions = torch.randint(0, 16, (n_tok,))
        cache = make_cache(16, rot)
        q, k, v = qk_norm_rope.split_qkv_rmsnorm_rope(
            qkv, qw, kw, 1e-6, positions, cache, h, kv, d, is_neox
        )
        rq, rk, rv = ref_split(qkv, qw, kw, 1e-6, positions, cache, h, kv, d, is_neox)
        check(q, rq, dtype)
        check(k, rk, dtype)
        assert torch.equal(v, qkv[:, (h + kv) * d :])

    def test_split_qkv_rmsnorm_rope_3d_no_weights():
        h, kv, d = 2, 1, 32
        qkv = torch.randn(2, 3, (h + 2 * kv) * d)
        positions = torch.randint(0, 10, (2, 3))
        cache = make_cache(10, 32)
        q, k, v = qk_norm_rope.split_qkv_rmsnorm_rope(
            qkv, None, None, 1e-6, positions, cache, h, kv, d, True
        )
        rq, rk, rv = ref_split(qkv, None, None, 1e-6, positions, cache, h, kv, d, True)
        check(q, rq, torch.float32)
        check(k, rk, torch.float32)
        assert q.shape == (2, 3, h * d)

    # ------------------------------------------------------------------ supports_args
    from opcore.kernels.triton import _register as reg

    def test_provider_is_interpreted_and_takes_cpu_tensors():
        import opcore.kernels.triton as kt

        assert kt.INTERPRETED and kt.DEVICE_TYPES == frozenset({"cpu"})

    def test_supports_args_accepts_what_the_kernels_handle():
        x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64)
        qkv = torch.randn(3, 8 * 32)
        pos, cache = torch.arange(3), make_cache(8, 16)
        q, k = qkv[:, :128], qkv[:, 128:192]
        cases = [
            reg.supports_rms_norm(x, w, 1e-6),
            reg.supports_rms_norm(strided_rows(5, 64, torch.float16), None, 1e-6, 64),
            reg.supports_fused_add_rms_norm(x, torch.randn_like(x), None, 1e-6),
            reg.supports_silu_and_mul(torch.randn(2, 3, 10)),
            reg.supports_gelu_and_mul(torch.randn(2, 10), "tanh"),
            reg.supports_rotary_embedding(pos, q, k, 32, cache, False),
            reg.supports_rotary_embedding(pos.int(), q.view(3, 4, 32), None, 32, cache, True),
            reg.supports_split_qkv_rmsnorm_rope(qkv, None, None, 1e-6, pos, cache, 4, 2, 32, True),
        ]
        assert all(c is True for c in cases), cases

    def test_supports_args_rejects_what_the_kernels_do_not_handle():
        x, w = torch.randn(4, 64), torch.randn(64)
        qkv = torch.randn(3, 8 * 32)
        pos, cache = torch.arange(3), make_cache(8, 16)
        q, k = qkv[:, :128], qkv[:, 128:192]
        cases = {
            "int input": reg.supports_rms_norm(x.int(), w, 1e-6),
            "fp64 input": reg.supports_rms_norm(x.double(), w, 1e-6),
            "strided last dim": reg.supports_rms_norm(x.t(), None, 1e-6),
            "variance_size 0": reg.supports_rms_norm(x, w, 1e-6, 0),
            "variance_size > hidden": reg.supports_rms_norm(x, w, 1e-6, 65),
            "variance_size bool": reg.supports_rms_norm(x, w, 1e-6, True),
            "weight size": reg.supports_rms_norm(x, torch.randn(63), 1e-6),
            "weight 2-D": reg.supports_rms_norm(x, torch.randn(1, 64), 1e-6),
            "tensor epsilon": reg.supports_rms_norm(x, w, torch.tensor(1e-6)),
            "meta device": reg.supports_rms_norm(x.to("meta"), None, 1e-6),
            "mixed devices": reg.supports_rms_norm(x, w.to("meta"), 1e-6),
            "overlapping residual rows": reg.supports_fused_add_rms_norm(
                x, torch.randn(1, 64).expand(4, 64), w, 1e-6
            ),
            "residual shape": reg.supports_fused_add_rms_norm(x, torch.randn(4, 32), None, 1e-6),
            "residual dtype": reg.supports_fused_add_rms_norm(x, x.half(), None, 1e-6),
            "odd last dim": reg.supports_silu_and_mul(torch.randn(2, 9)),
            "unknown approximation": reg.supports_gelu_and_mul(torch.randn(2, 8), "fast"),
            "float positions": reg.supports_rotary_embedding(pos.float(), q, k, 32, cache, True),
            "rot_dim > head_size": reg.supports_rotary_embedding(pos, q, k, 8, cache, True),
            "overlapping heads": reg.supports_rotary_embedding(
                pos, torch.randn(3, 1, 32).expand(3, 4, 32), None, 32, cache, True
            ),
            "key dtype": reg.supports_rotary_embedding(pos, q, k.half(), 32, cache, True),
            "token count": reg.supports_rotary_embedding(torch.arange(2), q, k, 32, cache, True),
            "is_neox not bool": reg.supports_rotary_embedding(pos, q, k, 32, cache, 1),
            "qkv width": reg.supports_split_qkv_rmsnorm_rope(
                qkv, None, None, 1e-6, pos, cache, 4, 1, 32, True
            ),
            "one weight": reg.supports_split_qkv_rmsnorm_rope(
                qkv, torch.randn(32), None, 1e-6, pos, cache, 4, 2, 32, True
            ),
            "positions count": reg.supports_split_qkv_rmsnorm_rope(
                qkv, None, None, 1e-6, torch.arange(4), cache, 4, 2, 32, True
            ),
        }
        accepted = [name for name, ok in cases.items() if ok is not False]
        assert not accepted, accepted

    def test_supports_args_on_fake_tensors():
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64)
            qkv, pos = torch.randn(3, 8 * 32), torch.arange(3)
            cache = torch.randn(8, 16)
            assert reg.supports_rms_norm(x, w, 1e-6) is True
            assert (
                reg.supports_rotary_embedding(pos, qkv[:, :128], qkv[:, 128:192], 32, cache, True)
                is True
            )
            assert (
                reg.supports_split_qkv_rmsnorm_rope(
                    qkv, w[:32], w[:32], 1e-6, pos, cache, 4, 2, 32, True
                )
                is True
            )
            assert reg.supports_silu_and_mul(torch.randn(2, 9)) is False

    def test_supports_args_on_symbolic_fake_tensors():
        # torch.compile with dynamic shapes: sizes and strides are SymInts, comparisons
        # SymBools; each answer must still be a plain bool.
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        mode = FakeTensorMode(shape_env=ShapeEnv())

        def sym(t):
            return mode.from_tensor(t, static_shapes=False)

        x, r, w = sym(torch.randn(5, 64)), sym(torch.randn(5, 64)), sym(torch.randn(64))
        qkv, pos, cache = sym(torch.randn(3, 8 * 32)), sym(torch.arange(3)), sym(torch.randn(8, 16))
        q, k = sym(torch.randn(3, 128)), sym(torch.randn(3, 64))
        with mode:
            answers = {
                "rms_norm": reg.supports_rms_norm(x, w, 1e-6),
                "fused_add_rms_norm": reg.supports_fused_add_rms_norm(x, r, w, 1e-6),
                "silu_and_mul": reg.supports_silu_and_mul(x),
                "gelu_and_mul": reg.supports_gelu_and_mul(x, "tanh"),
                "rotary_embedding": reg.supports_rotary_embedding(pos, q, k, 32, cache, True),
                "split_qkv_rmsnorm_rope": reg.supports_split_qkv_rmsnorm_rope(
                    qkv, w[:32], w[:32], 1e-6, pos, cache, 4, 2, 32, True
                ),
            }
        assert {name: type(a) for name, a in answers.items()} == dict.fromkeys(answers, bool)
        assert all(answers.values()), answers

    # ------------------------------------------------------------------ through opcore.ir
    def test_dispatch_runs_triton_and_maybe_inplace_donates():
        from opcore.ir import ops

        x, r = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(3, 64, dtype=torch.bfloat16)
        w = torch.randn(64, dtype=torch.bfloat16)
        s = (x.double() + r.double()).to(torch.bfloat16)
        ref = ref_rms(s, w, 1e-6)
        with ops.fused_add_rms_norm.set_priority(["triton", "native"]):
            assert ops.fused_add_rms_norm.dispatch(x, r, w, 1e-6).provider == "triton"
            x0, r0 = x.clone(), r.clone()
            out, res = ops.fused_add_rms_norm(x, r, w, 1e-6)
            assert torch.equal(x, x0) and torch.equal(r, r0)  # default overload mutates nothing
            check(out, ref, torch.bfloat16)
            out2, res2 = ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
            assert out2.data_ptr() == x.data_ptr() and res2.data_ptr() == r.data_ptr()
            check(out2, ref, torch.bfloat16)
            check(res2, s.double(), torch.bfloat16)
