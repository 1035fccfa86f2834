"""MSL conformance of the emulator (backend "mps-emu") for the idioms of real Metal code bases, each kernel
checked against a torch reference: templated kernels instantiated under host names, METAL_FUNC, type traits,
address-space-qualified members, [[threadgroup(n)]] parameters, simdgroup matrices, function constants, a
source's own bfloat overloads in metal::precise, class-scope explicit specializations, metal::array, matrix
types, simd_shuffle_and_fill_*, byte views, and compiling one kernel at a time. The kernels are in
tests/fixtures/msl/ (written for these tests)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from metal_accel.backends.mps_emu import backend as mps_emu
from metal_accel.backends.mps_emu.backend import MpsEmuBackend
from metal_accel.core.errors import CompileError, KernelLaunchError

pytestmark = [pytest.mark.needs_cxx, pytest.mark.skipif(not MpsEmuBackend().is_available(), reason="no C++ compiler")]

FIXTURES = Path(__file__).parent / "fixtures" / "msl"
HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"


@pytest.fixture(scope="module")
def tpl():
    return MpsEmuBackend().compile((FIXTURES / "templates.metal").read_text())


@pytest.fixture(scope="module")
def std():
    return MpsEmuBackend().compile((FIXTURES / "stdlib.metal").read_text(), {"use_scale": True, "repeat_n": 3})


# ---------------------------------------------------------------- templated kernels and host names

@pytest.mark.slow
def test_templated_kernels_run_under_their_host_names(tpl):
    assert set(tpl.kernel_names) >= {"square_f32", "square_f16_n2", "negate_i32", "negate_bf16", "row_sum"}
    x = torch.randn(100)
    out = torch.empty(100)
    tpl.square_f32(x, out, 100, arg_casts={2: "int32"})
    assert torch.equal(out, x * x)
    h = torch.randn(101).half()
    ho = torch.zeros(101).half()
    tpl.square_f16_n2(h, ho, 101, arg_casts={2: "int32"}, threads=51)  # two elements per thread
    assert torch.equal(ho, h * h)
    i = torch.randint(-50, 50, (64,), dtype=torch.int32)
    io = torch.empty_like(i)
    tpl.negate_i32(i, io, 64, arg_casts={2: "int32"})
    assert torch.equal(io, -i)
    b = torch.randn(64).bfloat16()
    bo = torch.empty_like(b)
    tpl.negate_bf16(b, bo, 64, arg_casts={2: "int32"})
    assert torch.equal(bo, -b)
    with pytest.raises(KernelLaunchError, match="dtype torch.float16"):  # T = half: checked like a plain kernel
        tpl.square_f16_n2(x, out, 100, arg_casts={2: "int32"})


@pytest.mark.slow
def test_llama_style_instantiations_byte_pointers_and_threadgroup_parameters(tpl):
    rows, n = 5, 300
    x = torch.randn(rows, n)
    args = torch.tensor([n, 0, n * 4, 0, 0, 0], dtype=torch.int32)  # {int ne00; <pad>; uint64 nb01; float scale; <pad>}
    args.view(torch.float32)[4] = 0.5
    out = torch.zeros(rows)
    tpl.row_sum(args, x, out, threads=rows * 96, group_size=96, threadgroup_sizes={0: 32 * 4})
    torch.testing.assert_close(out, x.sum(1) * 0.5, rtol=1e-5, atol=1e-5)
    tpl.row_sumsq(args, x, out, threads=rows * 64, group_size=64, threadgroup_sizes={0: 32 * 4})
    torch.testing.assert_close(out, (x * x).sum(1) * 0.5, rtol=1e-5, atol=1e-5)
    with pytest.raises(KernelLaunchError, match=r"threadgroup_sizes=\{0: bytes"):
        tpl.row_sum(args, x, out, threads=rows * 64, group_size=64)
    with pytest.raises(KernelLaunchError, match="multiple of 16"):
        tpl.row_sum(args, x, out, threads=rows * 64, group_size=64, threadgroup_sizes={0: 100})
    with pytest.raises(KernelLaunchError, match="threadgroup memory"):  # the 32 KiB limit counts them
        tpl.row_sum(args, x, out, threads=rows * 64, group_size=64, threadgroup_sizes={0: 64 * 1024})


@pytest.mark.slow
def test_address_space_qualified_members(tpl):
    pairs = torch.randn(64, 2)
    out = torch.empty(64)
    tpl.pair_members(pairs, out, threads=64, group_size=64)
    torch.testing.assert_close(out, pairs[:, 0] * 2 + pairs[:, 1] + pairs.sum(1) + 3.0)


@pytest.mark.slow
def test_simdgroup_matrix_tiles_in_a_templated_kernel(tpl):
    m, n = 16, 24
    for name, k, dt in (("gemm_f32_k16", 16, torch.float32), ("gemm_f16_k32", 32, torch.float16)):
        a, b = torch.randn(m, k).to(dt), torch.randn(k, n).to(dt)
        c = torch.empty(m, n)
        getattr(tpl, name)(a, b, c, n, arg_casts={3: "int32"}, threads=(n // 8 * 32, m // 8), group_size=(32, 1))
        torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- stdlib: precise:: lookup, constants, misc

@pytest.mark.slow
def test_precise_functions_on_float_stay_float_beside_bfloat_overloads(std):
    x = torch.tensor([33.63, -2.5, 0.1, 7.0] * 8)
    out = torch.empty(3 * 32)
    bout = torch.empty(32, dtype=torch.bfloat16)
    std.precise_float(x, out, bout)
    out = out.view(32, 3)
    torch.testing.assert_close(out[:, 0], torch.exp(x), rtol=1e-6, atol=0)  # exp(33.63) = 4.02e14, not 4.55e14
    torch.testing.assert_close(out[:, 1], torch.rsqrt(x * x + 1), rtol=1e-6, atol=0)
    torch.testing.assert_close(out[:, 2], torch.exp(x) + torch.clamp(x, min=0.5), rtol=1e-6, atol=0)
    assert torch.equal(bout, torch.exp(x.bfloat16().float()).bfloat16())


@pytest.mark.slow
def test_function_constants_are_supplied_at_compile_time(std):
    x = torch.randn(40)
    out = torch.empty(40)
    std.constants(x, out)
    torch.testing.assert_close(out, x * 8)  # use_scale, repeat_n = 3, bias_value undefined
    src = (FIXTURES / "stdlib.metal").read_text()
    other = MpsEmuBackend().compile(src, {0: False, "repeat_n": 2, "bias_value": 0.25})
    other.constants(x, out)
    torch.testing.assert_close(out, x + 2.25)
    missing = MpsEmuBackend().compile(src, {"use_scale": True})
    with pytest.raises(KernelLaunchError, match=r"function constant 'repeat_n' .* has no value"):
        missing.constants(x, out)


@pytest.mark.slow
def test_stdlib_names_arrays_matrices_and_initializers(std):
    x = torch.randn(8)
    raw = torch.randn(8)
    out = torch.empty(80)
    std.misc(x, out, raw.view(torch.uint8), threads=8, group_size=8)  # a char* binds any tensor as bytes
    o = out.view(8, 10)
    torch.testing.assert_close(o[:, 0], x + 6)                                        # metal::array
    torch.testing.assert_close(o[:, 1], (x.half() * 2).float() + 2)                   # half4x4 * half4
    torch.testing.assert_close(o[:, 2], 4 + 8 * x)                                    # float2x4 * float2
    assert torch.all(o[:, 3] == 3)                                                     # uint4 u = {1, 2, 3}
    assert torch.all(o[:, 4] == 6.5)                                                   # constexpr bfloat, = {0}
    assert torch.equal(o[:, 5], raw)                                                   # device const char*
    assert torch.all(o[:, 6] == 5)                                                     # class-scope template <>
    assert torch.all(o[:, 7] == 23)                                                    # numeric_limits internals
    assert torch.all(o[:, 8] == 13)                                                    # vec_elements, traits
    assert torch.equal(o[:7, 9], torch.arange(1, 8, dtype=torch.float32))             # global simd_ helper


@pytest.mark.slow
def test_simd_shuffle_and_fill(std):
    x = torch.arange(32, dtype=torch.float32) + 1
    out = torch.empty(4 * 32)
    std.shuffle_fill(x, out, threads=32, group_size=32)
    o = out.view(32, 4)
    lane = torch.arange(32)
    down = torch.where(lane + 3 < 32, x[(lane + 3) % 32], -x[(lane + 3) % 32])
    up = torch.where(lane - 2 >= 0, x[(lane - 2) % 32], -x[(lane - 2) % 32])
    seg, i = lane // 8 * 8, lane % 8
    down8 = torch.where(i + 1 < 8, x[seg + (i + 1) % 8], -x[seg + (i + 1) % 8])
    assert torch.equal(o[:, 0], down) and torch.equal(o[:, 1], up) and torch.equal(o[:, 2], down8)
    assert torch.all(o[:, 3] == x.bfloat16().float().sum().bfloat16().float())


# ---------------------------------------------------------------- compiling one kernel at a time, errors

@pytest.mark.slow
def test_a_source_with_many_kernels_compiles_only_the_kernels_it_runs():
    src = HEAD + "".join(f"kernel void k{i}(device float* o [[buffer(0)]], uint t [[thread_position_in_grid]]) "
                         f"{{ o[t] = {i}.0f + t; }}\n" for i in range(mps_emu.EAGER_MAX_KERNELS + 2))
    before = mps_emu.compile_count
    lib = MpsEmuBackend().compile(src + "// many kernels\n")
    assert mps_emu.compile_count == before and len(lib.kernel_names) == mps_emu.EAGER_MAX_KERNELS + 2
    out = torch.empty(4)
    lib.k3(out)
    assert torch.equal(out, torch.arange(4.0) + 3) and mps_emu.compile_count == before + 1
    lib.k3(out)
    lib.k5(out)
    assert torch.equal(out, torch.arange(4.0) + 5) and mps_emu.compile_count == before + 2


@pytest.mark.parametrize("src,match", [
    ("template <typename T> [[kernel]] void k(device T* o) {}\n"
     "template [[host_name(\"k_f\")]] [[kernel]] decltype(g<float>) g<float>;", r"names g<float>, but no templated"),
    ('#include "missing.h"\nkernel void k(device float* o) {}', r"line 3: '#include \"missing.h\"'.*paste"),
    ("kernel void k(device float* o, uint i [[thread_position_in_grid]]) { threadgroup float s[4] = {1}; }",
     r"line 3: threadgroup variable 's' has the initializer"),
])
def test_errors_name_the_feature_and_line(src, match):
    with pytest.raises(CompileError, match=match):
        MpsEmuBackend().compile(HEAD + src)


def test_an_include_in_an_inactive_branch_is_ignored_and_simd_definitions_in_namespaces_are_left_alone():
    src = HEAD + """
#ifdef NOT_DEFINED
#include "host_header.h"
#endif
namespace util {
template <typename T> METAL_FUNC T simd_total(T x) { return simd_sum(x); }
METAL_FUNC float simd_twice(float x) { return util::simd_total(x) * 2.0f; }
}
kernel void k(device float* o [[buffer(0)]], uint i [[thread_position_in_grid]]) { o[i] = util::simd_twice(1.0f); }
"""
    out = torch.empty(32)
    MpsEmuBackend().compile(src).k(out)
    assert torch.all(out == 64)


def test_assert_compiles_to_nothing_as_metal_does_without_shader_validation():
    src = HEAD + """
static void fill(device float* o, int n) {
    assert(n % 4 == 0);
    for (int i = 0; i < n; ++i) o[i] = float(i);
}
kernel void k(device float* o [[buffer(0)]], uint t [[thread_position_in_grid]]) {
    assert(t < 1);
    fill(o, 6);
}
"""
    out = torch.empty(6)
    MpsEmuBackend().compile(src).k(out, threads=1)
    assert torch.equal(out, torch.arange(6.0))


@pytest.mark.slow
def test_free_function_overloads_by_address_space_only_are_one_function():
    # Metal: the address space is part of the type, so these are two overloads; the emulator has one address
    # space and keeps the first (their bodies agree but for address spaces)
    lib = MpsEmuBackend().compile(HEAD + """
METAL_FUNC float ld(device const float* p, uint i) { return p[i]; }
METAL_FUNC float ld(threadgroup const float* p, uint i) { return p[i]; }
METAL_FUNC float twice(device const float& v) { return 2.0f * v; }
METAL_FUNC float twice(thread const float& v) { return 2.0f * v; }
kernel void k(device const float* x [[buffer(0)]], device float* o [[buffer(1)]],
              uint i [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float tile[32];
  tile[lid] = x[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float t = x[i];
  o[i] = ld(x, i) + ld(tile, lid) + twice(x[i]) + twice(t);
}
""")
    x, out = torch.randn(64), torch.zeros(64)
    lib.k(x, out, threads=64, group_size=32)
    torch.testing.assert_close(out, 6 * x)
    with pytest.raises(CompileError, match="address space only, with another body"):
        MpsEmuBackend().compile(HEAD + "METAL_FUNC float f(device const float* p) { return p[0]; }\n"
                                "METAL_FUNC float f(threadgroup const float* p) { return p[1]; }\n"
                                "kernel void k(device const float* x [[buffer(0)]], device float* o [[buffer(1)]], "
                                "uint i [[thread_position_in_grid]]) { o[i] = f(x); }\n")


@pytest.mark.slow
def test_parenthesized_array_declarators_are_declarations_not_subscripts():
    lib = MpsEmuBackend().compile(HEAD + """
METAL_FUNC float sum2(thread const float (&a)[2]) { return a[0] + a[1]; }
kernel void k(device const float* x [[buffer(0)]], device float* o [[buffer(1)]],
              uint i [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float tile[2][33];
  threadgroup float (*rows)[33] = tile;
  rows[0][lid] = 2.0f * x[i];
  rows[1][lid] = 1.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float a[2] = {tile[0][lid], (*(rows + 1))[lid]};
  o[i] = sum2(a);
}
""")
    x, out = torch.randn(64), torch.zeros(64)
    lib.k(x, out, threads=64, group_size=32)
    torch.testing.assert_close(out, 2 * x + 1)


@pytest.mark.slow
def test_member_and_constructor_overloads_by_parameter_address_space():
    # MLX's complex and bfloat types define thread and device copy constructors and member overloads
    lib = MpsEmuBackend().compile(HEAD + """
struct C {
  float r; float i;
  constexpr C(const thread C& o) = default;
  constexpr C(const device C& o) : r(o.r), i(o.i) {}
  float dot(const thread C& o) const { return r * o.r + i * o.i; }
  float dot(const device C& o) const { return r * o.r + i * o.i; }
};
kernel void k(device const C* a [[buffer(0)]], device float* out [[buffer(1)]], uint t [[thread_position_in_grid]]) {
  C c = a[t];
  C d(c);
  out[t] = c.dot(a[t]) + d.dot(c) + d.i;
}
""")
    a, out = torch.randn(9, 2), torch.zeros(9)
    lib.k(a, out, threads=9)
    torch.testing.assert_close(out, 2 * (a * a).sum(1) + a[:, 1])


@pytest.mark.slow
def test_checked_division_and_indexing_stay_constant_expressions():
    # the emulator's division-by-zero and bounds checks wrap `/`, `%` and `[]`; inside constant expressions
    # (MLX's `static constant constexpr short TM = BM / (8 * WM)`, static_assert, table lookups) they must fold
    lib = MpsEmuBackend().compile(HEAD + """
constant constexpr int kTab[4] = {8, 16, 32, 64};
template <int BM, int WM> struct Tile {
  static constant constexpr const short TM = BM / (8 * WM);
  static_assert(BM % WM == 0, "tiles");
  float v[BM / WM];
};
constexpr int halve(int a, int b) { return a / b; }
kernel void k(device float* out [[buffer(0)]], uint t [[thread_position_in_grid]]) {
  constexpr int d = 4;
  constexpr int q = kTab[2] / d;
  static_assert(kTab[1] == 16, "table");
  Tile<32, 2> tile;
  tile.v[0] = float(Tile<32, 2>::TM);
  out[t] = float(q + halve(12, 3)) + tile.v[0] + float(metal::vec<float, kTab[0] / 4>(1.0f).y);
}
""")
    out = torch.zeros(3)
    lib.k(out, threads=3)
    assert out.tolist() == [8.0 + 4.0 + 2.0 + 1.0] * 3


@pytest.mark.slow
def test_simd_functions_reached_through_member_functions_see_reconverged_lanes():
    # after `v = lane < 4 ? scratch[lane] : 0` every lane is active again at the simd_max, also when the call goes
    # through a static member (MLX's op.simd_reduce) or a method holding the divergence: all lanes get the max
    lib = MpsEmuBackend().compile(HEAD + """
float free_reduce(float v) { return simd_max(v); }
struct MaxOp { static float simd_reduce(float v) { return simd_max(v); } };
struct Reducer {
  threadgroup float* s;
  float reduce(ushort ln) const { float v = ln < 4 ? s[ln] : 0.f; return free_reduce(v); }
};
kernel void k(device const float* x [[buffer(0)]], device float* out [[buffer(1)]], device float* out2 [[buffer(2)]],
              uint lid [[thread_position_in_threadgroup]], ushort sg [[simdgroup_index_in_threadgroup]],
              ushort ln [[thread_index_in_simdgroup]]) {
  threadgroup float scratch[4];
  float v = simd_max(x[lid]);
  if (ln == 0) scratch[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  v = ln < 4 ? scratch[ln] : 0.f;
  out[lid] = MaxOp::simd_reduce(v);
  Reducer r{scratch};
  out2[lid] = r.reduce(ln);
}
""")
    x = torch.rand(128) + 1
    out, out2 = torch.zeros(128), torch.zeros(128)
    lib.k(x, out, out2, threads=128, group_size=128)
    assert torch.equal(out, torch.full((128,), x.max().item())) and torch.equal(out2, out)
