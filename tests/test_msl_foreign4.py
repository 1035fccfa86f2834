"""A fourth batch of foreign-style Metal kernels (tests/fixtures/msl_foreign4/*.metal, written in the styles of
ggml-metal, MLX, PyTorch MPS, metal-flash-attention, candle, tinygrad and Apple's samples), each run through the
emulator's public path and compared with torch, plus the constructs a Mac would not compute the emulator's way,
which must fail with an error naming them: float -> int conversions out of range (MSL spec 2.14: no saturation),
vector loads through misaligned pointers (a process crash before), and barriers not every thread reaches.
One driver runs every case: (fixture, function constants, run(lib) -> (got, want, tol) or None, error pattern)."""
from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
import torch

from metal_accel.backends.mps_emu.backend import MpsEmuBackend
from metal_accel.backends.mps_emu.msl_translate import translate_unit
from metal_accel.core.errors import CompileError, KernelLaunchError

FIXTURES = Path(__file__).parent / "fixtures" / "msl_foreign4"
no_compiler = pytest.mark.skipif(not MpsEmuBackend().is_available(), reason="no C++ compiler")
_LIBS: dict = {}


def _lib(name: str, constants: dict | None = None):
    key = (name, tuple(sorted((constants or {}).items(), key=str)))
    if key not in _LIBS:
        _LIBS[key] = MpsEmuBackend().compile((FIXTURES / f"{name}.metal").read_text(), function_constants=constants)
    return _LIBS[key]


def _bytes(fmt: str, *values) -> torch.Tensor:
    return torch.frombuffer(bytearray(struct.pack(fmt, *values)), dtype=torch.uint8)


# ---------------------------------------------------------------- ggml
def _mul_mv(dtype, nsg, ne00=72, ne01=7, ne11=5):
    def run(lib):
        a, b = torch.randn(ne01, ne00).to(dtype), torch.randn(ne11, ne00)
        out = torch.full((ne11, ne01), float("nan"))
        es = a.element_size()
        args = _bytes("<3i4x3Q2i2Q2ih6x", ne00, ne01, 1, es, ne00 * es, ne00 * es * ne01, ne00, ne11, 4, ne00 * 4,
                      ne01, ne11, 1)
        name = "kernel_mul_mv_f16_f32" if dtype == torch.float16 else "kernel_mul_mv_f32_f32"
        getattr(lib, name)(args, a, b, out, threads=((ne01 + nsg - 1) // nsg * 32 * nsg, (ne11 + 3) // 4, 1),
                           group_size=(32 * nsg, 1, 1))
        return out, b @ a.float().T, 1e-4
    return run


def _q8_roundtrip(lib):
    x = torch.randn(4 * 32)
    blocks = torch.zeros(4 * 34, dtype=torch.uint8)
    lib.kernel_cpy_f32_q8_0(x, blocks, 4, threads=4)
    out = torch.empty(128)
    lib.kernel_get_rows_q8_0(blocks, out, threads=128)
    xb = x.view(4, 32)
    d = xb.abs().amax(1, keepdim=True) / 127
    return out, (torch.round(xb * (1 / d)) * d.half().float()).flatten(), 1e-6


def _add_bcast(lib):
    ne00, ne01, ne10, ne11 = 50, 6, 10, 3
    a, b, o = torch.randn(ne01, ne00), torch.randn(ne11, ne10), torch.empty(ne01, ne00)
    lib.kernel_add_f32(_bytes("<2iQ2iQQ", ne00, ne01, ne00 * 4, ne10, ne11, ne10 * 4, ne00 * 4), a, b, o,
                       threads=(ne01 * 16, 1, 1), group_size=(16, 1, 1))
    return o, a + b.repeat(ne01 // ne11, ne00 // ne10), 0


# ---------------------------------------------------------------- MLX
def _quantize(bits):
    def run(lib):
        w = torch.randn(4, 64)
        out, sc, bi = torch.zeros(w.numel() * bits // 8, dtype=torch.uint8), torch.zeros(8), torch.zeros(8)
        getattr(lib, f"affine_quantize_float_gs_32_b_{bits}")(w, out, sc, bi, threads=(64, 4), group_size=(64, 1))
        g = w.view(-1, 32)
        wmin, wmax, nb = g.amin(1), g.amax(1), (1 << bits) - 1
        scale = torch.clamp((wmax - wmin) / nb, min=1e-7)
        side = wmin.abs() > wmax.abs()
        scale, edge = torch.where(side, scale, -scale), torch.where(side, wmin, wmax)
        q0 = torch.round(edge / scale)
        scale = torch.where(q0 == 0, scale, edge / q0)
        bias = torch.where(q0 == 0, torch.zeros_like(edge), edge)
        q = torch.clamp(torch.round((g - bias[:, None]) / scale[:, None]), max=nb).to(torch.int32).flatten()
        packed = (q.view(-1, 2)[:, 0] | (q.view(-1, 2)[:, 1] << 4)) if bits == 4 else q
        return torch.cat([out.float(), sc, bi]), torch.cat([packed.float(), scale, bias]), 1e-6
    return run


def _gemv(name, dtype, bm, tol):
    def run(lib):
        M, K = 5, 300
        A, x = torch.randn(M, K + 3).to(dtype), torch.randn(K).to(dtype)
        y = torch.full((M,), float("nan")).to(dtype)
        getattr(lib, name)(A, x, y, K, M, K + 3, threads=(M * 32 * bm, 1, 1), group_size=(32 * bm, 1, 1),
                           arg_casts={3: "int32", 4: "int32"})
        return y.float(), A[:, :K].float() @ x.float(), tol
    return run


def _scan(lib):
    x, o = torch.randint(-50, 50, (100,), dtype=torch.int32), torch.zeros(100, dtype=torch.int32)
    lib.scan_rev_i32(x, o, 100, threads=128, group_size=128)
    xf, of = torch.randn(100), torch.zeros(100)
    lib.scan_fwd_f32(xf, of, 100, threads=128, group_size=128)
    return torch.cat([o.float(), of]), torch.cat([x.flip(0).cumsum(0).flip(0).float(), xf.cumsum(0)]), 1e-5


# ---------------------------------------------------------------- PyTorch
def _torch_int_ops(lib):
    a = torch.tensor([7, -7, 7, -7, 0, 5, -9, 100000, -1], dtype=torch.int32)
    b = torch.tensor([2, 2, -2, -2, 3, -5, 4, -7, 3], dtype=torch.int32)
    got, want = [], []
    for name, x, y, ref in (("div_floor_dense_int", a, b, torch.div(a, b, rounding_mode="floor")),
                            ("div_floor_dense_long", a.long() * 3000000000, b.long(),
                             torch.div(a.long() * 3000000000, b.long(), rounding_mode="floor")),
                            ("remainder_dense_int", a, b, torch.remainder(a, b)),
                            ("remainder_dense_short", a.short() % 1000, b.short(), torch.remainder(a.short() % 1000, b.short()))):
        o = torch.empty_like(x)
        getattr(lib, name)(o, x, y)
        got.append(o.double()), want.append(ref.double())
    af = torch.tensor([7.5, -7.5, 1e30, -0.0, float("inf"), float("nan"), 5.0])
    bf = torch.tensor([2.0, 2.0, 3.0, 1.0, 2.0, 1.0, float("inf")])
    for name, ref in (("div_floor_dense_float", torch.floor(af / bf)), ("fmod_dense_float", torch.fmod(af, bf))):
        o = torch.empty_like(af)
        getattr(lib, name)(o, af, bf)
        got.append(o.double()), want.append(ref.double())
    s = torch.tensor([-1, -17, 17, 2**31 - 1, -2**31, 300, -200, 40], dtype=torch.int32)
    o = torch.empty(8, 4, dtype=torch.int32)
    lib.int_semantics(s, o)
    x = s.long()
    low = x & 0xFF
    want.append(torch.stack([x >> 3, (x & 0xFFFFFFFF) >> 28, ((x * 1000) & 0xFFFF).to(torch.int16).long(),
                             low + low.to(torch.uint8).to(torch.int8).long() * 1000], 1).flatten().double())
    got.append(o.flatten().double())
    return torch.cat(got), torch.cat(want), 0


def _torch_cvt(lib):
    x = torch.tensor([2.7, -2.7, 0.99, -0.99, 3276.7, -3276.0, 65.9, 0.0])
    oi, ou, os_ = torch.empty(8, dtype=torch.int32), torch.empty(8, dtype=torch.int32), torch.empty(8, dtype=torch.int16)
    lib.to_int(x, oi, ou, os_)
    f = torch.tensor([2.7, -2.7, 200.2, -100.6])
    of = torch.empty(4, 4, dtype=torch.int32)
    lib.cvt_forms(f, of)
    t = f.double().trunc()
    forms = torch.stack([t * 2 + (-f.double()).trunc(), t.abs(), (f.double().abs() + 0.5).trunc(), t], 1)
    got = torch.cat([oi.double(), ou.double(), os_.double(), of.flatten().double()])
    return got, torch.cat([x.double().trunc(), x.double().abs().trunc(), (x * 10).double().trunc(), forms.flatten()]), 0


def _launch(kernel, x, out_dtype=torch.int32, **kw):
    def run(lib):
        getattr(lib, kernel)(x, torch.zeros(x.shape, dtype=out_dtype), **kw)
    return run


def _cast_float(lib):
    x, o = torch.tensor([-3e10, float("nan"), 2.5]), torch.zeros(3)
    lib.cvt_template_float(x, o)
    return o, x, 0


# ---------------------------------------------------------------- metal-flash-attention, candle, tinygrad, Apple
def _mfa(M, N, K, at, bt, alpha):
    def run(lib):
        got, want = [], []
        for dtype, name in ((torch.float32, "sgemm"), (torch.float16, "hgemm")):
            A, B = torch.randn(M, K).to(dtype), torch.randn(K, N).to(dtype)
            C = torch.full((M, N), float("nan")).to(dtype)
            getattr(lib, name)(A.T.contiguous() if at else A, B.T.contiguous() if bt else B, C,
                               threads=(N // 8 * 32, M // 8), group_size=(32, 1))
            got.append(C.float().flatten()), want.append(((A.float() @ B.float()) * (alpha or 1.0)).flatten())
        return torch.cat(got), torch.cat(want), 2e-2
    return run


def _gelu(x):
    x = x.double()
    inner = (2 / torch.pi**0.5 * 0.5**0.5) * (x + 0.044715 * x**3)
    return torch.where(x > 5, x, 0.5 * x * (1 + torch.tanh(inner)))


def _candle(lib):
    x = torch.randn(6, 7) * 3
    o1, o2, o3 = torch.empty(42), torch.empty(42), torch.empty(42, dtype=torch.bfloat16)
    lib.gelu_f32(42, x, o1, threads=64)
    lib.gelu_f32_strided(42, 2, [7, 6], [1, 7], x, o2, threads=64)  # x.T through dims and strides
    lib.gelu_bf16(42, x.bfloat16(), o3, threads=42)
    s, d1, d2 = torch.randn(1000), torch.empty(3), torch.empty(3)
    lib.fast_sum_f32(1000, 334, s, d1, threads=3 * 128, group_size=128)
    lib.fast_max_f32(1000, 334, s, d2, threads=3 * 64, group_size=64)
    parts = (s[:334], s[334:668], s[668:])
    got = torch.cat([o1, o2, (o3.float() - _gelu(x.bfloat16().float().flatten()).float()) / 1000, d1, d2])
    want = torch.cat([_gelu(x.flatten()).float(), _gelu(x.T.flatten()).float(), torch.zeros(42),
                      torch.stack([p.sum() for p in parts]), torch.stack([p.max() for p in parts])])
    return got, want, 1e-4


def _tinygrad(lib):
    a, b, o = torch.randn(4, 64) / 4, torch.randn(4) / 4, torch.empty(4)
    lib.r_4_16_4(o, a, b, threads=(64, 1, 1), group_size=(16, 1, 1))
    s = (a.view(4, 16, 4).sum(-1)[:, :, None] * (b * torch.arange(1, 5).float())[None, None, :]).sum(-1)
    A, B, C = torch.randn(8, 16), torch.randn(16, 8), torch.empty(8, 8)
    lib.r_wmma(C, A, B, threads=(32, 1, 1), group_size=(32, 1, 1))
    return torch.cat([o, C.flatten()]), torch.cat([torch.exp(s.max(1).values), (A @ B).flatten()]), 1e-5


def _apple(lib):
    H, W = 20, 37
    x, o = torch.randn(H, W), torch.full((W, H), float("nan"))
    lib.transpose_tiled(x, o, torch.tensor([W, H], dtype=torch.int32), threads=(48, 32), group_size=(16, 16))
    v, ov = torch.randn(16, 4), torch.empty(16, 4)
    lib.quad_ops(v, ov, threads=16, group_size=16)
    q = v.view(4, 4, 4)
    quad = torch.stack([q[:, :, 0].sum(1, keepdim=True).expand(4, 4).flatten(), v[torch.arange(16) ^ 1, 1],
                        q[:, 0:1, 0].expand(4, 4).flatten(), torch.arange(16).float() + 4000], 1)
    xb = torch.randn(40)
    xb[32:] = -1.0
    ob = torch.empty(40, 2, dtype=torch.int32)
    lib.ballot_rank(xb, ob, threads=40, group_size=40)
    ballot = []
    for g in ((xb > 0)[:32], (xb > 0)[32:]):
        c = int(g.sum())
        ballot += [[c, (int(g[:l].sum()) if g[l] else -1) if c else 12346] for l in range(len(g))]
    P, oh, of = torch.randn(5, 4), torch.empty(5, 4, dtype=torch.float16), torch.empty(5, 4)
    lib.vec_misc(P, oh, of, threads=5)
    xs, on = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 2.0]), torch.empty(40)
    lib.nan_inf(xs, on, threads=5)
    one, fmax = torch.ones(5), 3.4028234663852886e38
    nan_inf = torch.stack([torch.exp(xs), torch.log(xs), torch.where(xs.isnan(), one, torch.maximum(xs, one)),
                           torch.where(xs.isnan(), -one, xs.clamp(-1, 1)), xs / 0.0,  # fmin/fmax: NaN gives the other
                           torch.tensor([fmax * 0.5, float("inf"), fmax * 0.5, fmax * 0.5, float("inf")]),
                           xs.isnan().float() + 2 * xs.isinf().float() + 4 * torch.signbit(xs).float(), -xs], 1)
    got = [o.flatten(), ov.flatten(), (ob.long() & 0xFFFFFFFF).double().flatten(), oh.double().flatten(),
           of.flatten(), on]
    want = [x.T.flatten(), quad.flatten(), (torch.tensor(ballot) & 0xFFFFFFFF).double().flatten(),
            torch.stack([P[:, 2], P[:, 1], P[:, 0], P[:, 3]], 1).half().double().flatten(),
            torch.cat([P[:, :3].abs(), (P[:, 0] * P[:, 1] + P[:, 3].clamp(0, 1))[:, None]], 1).flatten(),
            nan_inf.flatten()]
    return torch.cat([g.double() for g in got]), torch.cat([w.double() for w in want]), 1e-6


def _diverge(kernel):
    def run(lib):
        x, y = torch.randn(100), torch.zeros(100)
        if kernel in ("branch_barrier", "two_barriers"):
            getattr(lib, kernel)(y, threads=64, group_size=64)
        elif kernel == "uniform_return":
            lib.uniform_return(x, y, 2, threads=(32, 3), group_size=(32, 1), arg_casts={2: "int32"})
            return y[:64], x[:64].view(2, 32).flip(1).flatten(), 0
        else:
            getattr(lib, kernel)(x, y, 100, threads=128, group_size=64, arg_casts={2: "int32"})
            want = torch.cat([torch.cat([x, torch.zeros(28)]).view(2, 64).flip(1).flatten()[:100]])
            return y, want, 0
    return run


CASES = {
    # name: (fixture, function constants, run, error pattern or None)
    "ggml_mul_mv_f16_nsg1": ("ggml", {"FC_mul_mv_nsg": 1}, _mul_mv(torch.float16, 1), None),
    "ggml_mul_mv_f32_nsg2_by_index": ("ggml", {600: 2}, _mul_mv(torch.float32, 2), None),
    "ggml_mul_mv_misaligned_float4_rows": ("ggml", {600: 1}, _mul_mv(torch.float32, 1, ne00=70),
                                           r"misaligned read of 16 bytes at line 56: .*byte 280 of src[01] \(argument [12]\)"),
    "ggml_q8_0_roundtrip": ("ggml", None, _q8_roundtrip, None),
    "ggml_add_broadcast": ("ggml", None, _add_bcast, None),
    "ggml_unset_function_constant": ("ggml", None, _mul_mv(torch.float32, 1), r"FC_mul_mv_nsg"),
    "mlx_quantize_4bit": ("mlx", None, _quantize(4), None),
    "mlx_quantize_8bit": ("mlx", None, _quantize(8), None),
    "mlx_gemv_f32": ("mlx", None, _gemv("gemv_f32_bm2", torch.float32, 2, 1e-5), None),
    "mlx_gemv_f16": ("mlx", None, _gemv("gemv_f16_bm1", torch.float16, 1, 2e-2), None),
    "mlx_scan": ("mlx", None, _scan, None),
    "torch_integer_ops": ("torch", None, _torch_int_ops, None),
    "torch_float_to_int_in_range": ("torch", None, _torch_cvt, None),
    "float_to_int_too_large": ("torch", None, _launch("to_int_any", torch.tensor([3e9])),
                               r"conversion of the float 3e\+09 to int, which cannot hold it, at line 53"),
    "float_to_int_nan": ("torch", None, _launch("to_int_any", torch.tensor([float("nan")])), r"float nan to int"),
    "float_to_uint_negative": ("torch", None, _launch("to_uint_any", torch.tensor([-1.0])), r"float -1 to uint"),
    "half_to_char_c_cast": ("torch", None, _launch("half_to_char", torch.tensor([300.0]).half(), torch.int8),
                            r"half 300 to char"),
    "static_cast_ushort_negative": ("torch", None, _launch("cvt_static_ushort", torch.tensor([-2.5]), torch.int16),
                                    r"float -2.5 to ushort"),
    "vector_conversion_inf": ("torch", None, _launch("cvt_vector", torch.tensor([[1.0, float("inf"), 0, 0]])),
                              r"float inf to int, which cannot hold it, at line 70"),
    "static_cast_to_template_parameter": ("torch", None, _launch("cvt_template_int", torch.tensor([-3e10])),
                                          r"float -3[0-9.]*e\+10 to int, which cannot hold it, at line 74"),
    "static_cast_to_float_template_parameter": ("torch", None, _cast_float, None),
    "mfa_gemm": ("mfa", {"M": 16, "N": 24, "K": 16, "A_trans": False, "B_trans": False}, _mfa(16, 24, 16, False, False, None), None),
    "mfa_gemm_a_trans_alpha": ("mfa", {"M": 8, "N": 16, "K": 24, "A_trans": True, "B_trans": False, "alpha": 2.0},
                               _mfa(8, 16, 24, True, False, 2.0), None),
    "mfa_gemm_both_trans": ("mfa", {0: 16, 1: 8, 2: 8, 10: True, 11: True}, _mfa(16, 8, 8, True, True, None), None),
    "candle_unary_and_reduce": ("candle", None, _candle, None),
    "tinygrad_reduce_and_wmma": ("tinygrad", None, _tinygrad, None),
    "apple_transpose_quad_ballot_vec_nan": ("apple", None, _apple, None),
    "early_return_before_barrier": ("diverge", None, _diverge("early_return_barrier"),
                                    r"barrier divergence: .*threadgroup_barrier at line 11.*finished without reaching"),
    "barrier_in_divergent_branch": ("diverge", None, _diverge("branch_barrier"), r"barrier divergence: .* at line 19"),
    "barriers_on_both_sides_of_a_branch": ("diverge", None, _diverge("two_barriers"),
                                           r"barrier divergence: .* at line 46 while thread 32 .* at line 49"),
    "uniform_return_before_barrier": ("diverge", None, _diverge("uniform_return"), None),
    "return_after_last_barrier": ("diverge", None, _diverge("late_return"), None),
}


@pytest.mark.slow
@pytest.mark.needs_cxx
@no_compiler
@pytest.mark.parametrize("case", sorted(CASES))
def test_foreign_kernel(case):
    fixture, constants, run, error = CASES[case]
    lib = _lib(fixture, constants)
    if error:
        with pytest.raises(KernelLaunchError, match=error):
            run(lib)
        return
    got, want, tol = run(lib)
    torch.testing.assert_close(got.double(), want.double(), atol=tol, rtol=tol, equal_nan=True)


@pytest.mark.parametrize("attr", ["dispatch_quads_per_threadgroup", "thread_index_in_quad"])
def test_attributes_metal_does_not_have_are_rejected(attr):
    src = f"kernel void k(device float* y [[buffer(0)]], uint q [[{attr}]]) {{ y[0] = float(q); }}"
    with pytest.raises(CompileError, match=re.escape(f"[[{attr}]]")):
        translate_unit(src)


def test_function_constant_index_is_an_integer_expression():
    src = ("constant short nsg [[function_constant(600 + 2 * 4)]];\n"
           "kernel void k(device float* y [[buffer(0)]]) { y[0] = float(nsg); }")
    body, _ = translate_unit(src, function_constants={608: 3})
    assert "static constexpr short nsg = short(3)" in body
    with pytest.raises(CompileError, match=r"function_constant\(n \+ 1\)"):
        translate_unit(src.replace("600 + 2 * 4", "n + 1"), function_constants={})


@pytest.mark.parametrize("cast,rewritten", [
    ("int(v)", "int(ma_rt::cvt<int>((v), __LINE__))"),
    ("static_cast<uint>(v)", "static_cast<uint>(ma_rt::cvt<uint>((v), __LINE__))"),
    ("(int)v * 2", "(int)(ma_rt::Fc<int, __LINE__>)v * 2"),
    ("(unsigned int)-v", "(unsigned int)(ma_rt::Fc<unsigned int, __LINE__>)-v"),
    ("static_cast<IdxT>(v)", "static_cast<IdxT>(ma_rt::cvt<IdxT>((v), __LINE__))"),
    ("static_cast<float>(v)", "static_cast<float>(v)"),
    ("sizeof(int) * 2", "sizeof(int) * 2"),
    ("float(v)", "float(v)"),
])
def test_float_to_int_casts_are_checked(cast, rewritten):
    src = f"kernel void k(device float* y [[buffer(0)]]) {{ float v = y[0]; y[1] = {cast}; }}"
    body, _ = translate_unit(src)
    assert rewritten in body.replace("( ", "(").replace(" )", ")")
