"""The MSL emulator (backend "mps-emu"): conformance per feature against torch, the launch convention
of torch.mps.compile_shader, errors, and the disk cache. Kernels are grouped into two sources so that
two compilations serve most tests."""
from __future__ import annotations

import math

import pytest
import torch

from metal_accel.backends import get_backend, known_backends
from metal_accel.backends.mps_emu import backend as mps_emu
from metal_accel.backends.mps_emu.backend import MpsEmuBackend
from metal_accel.core.errors import CompileError, KernelLaunchError

pytestmark = [pytest.mark.needs_cxx, pytest.mark.skipif(not MpsEmuBackend().is_available(), reason="no C++ compiler")]

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"

# ---------------------------------------------------------------- kernels without barriers (plain loop)
SRC_A = HEAD + r"""
#define NREC 16
kernel void ids(device uint* out [[buffer(0)]],
                uint3 gid [[thread_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]],
                uint3 tg [[threadgroup_position_in_grid]], uint3 tptg [[threads_per_threadgroup]],
                uint3 dtptg [[dispatch_threads_per_threadgroup]], uint3 ntg [[threadgroups_per_grid]],
                uint3 grid [[threads_per_grid]], uint tidx [[thread_index_in_threadgroup]],
                ushort lane [[thread_index_in_simdgroup]], ushort sg [[simdgroup_index_in_threadgroup]],
                uint width [[threads_per_simdgroup]]) {
    uint idx = (gid.z * grid.y + gid.y) * grid.x + gid.x;
    device uint* r = out + idx * NREC;
    r[0] = gid.x; r[1] = gid.y; r[2] = gid.z; r[3] = lid.x; r[4] = lid.y; r[5] = lid.z;
    r[6] = tg.x; r[7] = tg.y; r[8] = tg.z; r[9] = tptg.x; r[10] = tptg.y; r[11] = dtptg.x;
    r[12] = ntg.x * 10000 + ntg.y * 100 + ntg.z; r[13] = tidx; r[14] = lane + 100 * sg; r[15] = width;
}

// arguments bind by buffer index, not by parameter order
kernel void scale(device float* out [[buffer(1)]], device const float* in [[buffer(0)]],
                  constant float& s [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    out[i] = in[i] * s;
}

kernel void vecs(device const float4* a, device float4* out, device int4* iout, constant float2& s,
                 uint i [[thread_position_in_grid]]) {
    float4 v = a[i];
    float4 w = v.wzyx * s.x + float4(v.xy, v.zw) - s.y;
    w.xz = w.zx;
    float3 c = cross(v.xyz, float3(1.0, 2.0, 3.0));
    out[i * 4 + 0] = w;
    out[i * 4 + 1] = float4(c, dot(v, v));
    out[i * 4 + 2] = float4(length(v.xy), normalize(v).x, select(v.x, v.y, v.z > v.w), all(v > 0.0) ? 1.0 : 0.0);
    float4 q = v; q.rgb += 1.0f; q.a = -q.a; q.yw *= 2.0f;
    out[i * 4 + 3] = q;
    int4 iv = int4(v * 10.0f);
    iv.xy = iv.yx + int2(1, 2);
    iv.w = int(popcount(uint(abs(iv.z))));
    iout[i] = iv;
}

kernel void halfs(device const half* h [[buffer(0)]], device const bfloat* bf [[buffer(1)]],
                  device half* ho [[buffer(2)]], device bfloat* bo [[buffer(3)]], device float* fo [[buffer(4)]],
                  constant half& hs [[buffer(5)]], uint i [[thread_position_in_grid]]) {
    half x = h[i];
    half2 v = half2(x, x * hs);
    ho[i] = v.x * v.y + 1.0h;
    bfloat b = bf[i];
    bo[i] = b * b;
    fo[i] = float(x) + float(b);
}

kernel void mathk(device const float* x [[buffer(0)]], device const float* y [[buffer(1)]],
                  device float* o [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    float a = x[i], b = y[i];
    device float* r = o + i * 24;
    r[0] = exp(a); r[1] = exp2(a); r[2] = log(b); r[3] = sqrt(b); r[4] = rsqrt(b); r[5] = tanh(a);
    r[6] = sin(a); r[7] = cos(a); r[8] = pow(b, a); r[9] = fma(a, b, 1.0f); r[10] = fast::exp(a);
    r[11] = precise::tanh(a); r[12] = floor(a); r[13] = ceil(a); r[14] = round(a); r[15] = abs(a);
    r[16] = min(a, b); r[17] = max(a, 0.0f); r[18] = clamp(a, -1.0f, 1.0f); r[19] = mix(a, b, 0.25f);
    r[20] = step(0.0f, a); r[21] = smoothstep(-1.0f, 1.0f, a); r[22] = log2(b) + log10(b);
    r[23] = fast::divide(a, b) + precise::sqrt(b);
}

kernel void bits(device const float* x [[buffer(0)]], device uint* u [[buffer(1)]], device half2* h [[buffer(2)]],
                 device float* back [[buffer(3)]], uint i [[thread_position_in_grid]]) {
    uint b = as_type<uint>(x[i]);
    u[i] = b;
    h[i] = as_type<half2>(x[i]);
    back[i] = as_type<float>(b ^ 0x80000000u);
}

struct Params { uint n; float scale; };
[[host_name("scaled_iota")]] kernel void iota_impl(device float* o [[buffer(0)]], constant Params& p [[buffer(1)]],
                                                  uint i [[thread_position_in_grid]]) {
    if (i < p.n) o[i] = p.scale * float(i);
}
[[kernel]] void shape_code(device float* o, constant uint* shape, uint i [[thread_position_in_grid]]) {
    o[i] = float(shape[0] * 10 + shape[1]);
}

kernel void hist(device const uint* vals [[buffer(0)]], device atomic_uint* bins [[buffer(1)]],
                 device atomic_float* total [[buffer(2)]], constant uint& n [[buffer(3)]],
                 uint i [[thread_position_in_grid]]) {
    if (i < n) {
        atomic_fetch_add_explicit(&bins[vals[i] % 16], 1u, memory_order_relaxed);
        atomic_fetch_add_explicit(total, float(vals[i]), memory_order_relaxed);
    }
}
"""

# ---------------------------------------------------------------- kernels with barriers and SIMD-group functions
SRC_B = HEAD + r"""
kernel void tree_sum(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                     constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]],
                     uint lid [[thread_position_in_threadgroup]], uint tg [[threadgroup_position_in_grid]],
                     uint tgs [[threads_per_threadgroup]]) {
    threadgroup float buf[256];
    buf[lid] = gid < n ? x[gid] : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = tgs / 2; s > 0; s >>= 1) {
        if (lid < s) buf[lid] += buf[lid + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (lid == 0) out[tg] = buf[0];
}

kernel void transpose(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                      constant uint& rows [[buffer(2)]], constant uint& cols [[buffer(3)]],
                      uint2 gid [[thread_position_in_grid]], uint2 lid [[thread_position_in_threadgroup]],
                      uint2 tgp [[threadgroup_position_in_grid]]) {
    threadgroup float tile[16][17];
    if (gid.x < cols && gid.y < rows) tile[lid.y][lid.x] = in[gid.y * cols + gid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint ox = tgp.y * 16 + lid.x, oy = tgp.x * 16 + lid.y;
    if (ox < rows && oy < cols) out[oy * rows + ox] = tile[lid.x][lid.y];
}

kernel void hist_tg(device const uint* vals [[buffer(0)]], device atomic_uint* bins [[buffer(1)]],
                    constant uint& n [[buffer(2)]], uint i [[thread_position_in_grid]],
                    uint lid [[thread_position_in_threadgroup]], uint tgs [[threads_per_threadgroup]]) {
    threadgroup atomic_uint local[16];
    for (uint b = lid; b < 16; b += tgs) atomic_store_explicit(&local[b], 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (i < n) atomic_fetch_add_explicit(&local[vals[i] % 16], 1u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint b = lid; b < 16; b += tgs)
        atomic_fetch_add_explicit(&bins[b], atomic_load_explicit(&local[b], memory_order_relaxed), memory_order_relaxed);
}

float lane_sum(float v) { return simd_sum(v); }  // a helper that reaches a SIMD-group function

kernel void simd_ops(device const float* x [[buffer(0)]], device float* o [[buffer(1)]], device uint* u [[buffer(2)]],
                     uint gid [[thread_position_in_grid]], ushort lane [[thread_index_in_simdgroup]]) {
    float v = x[gid];
    device float* r = o + gid * 12;
    r[0] = lane_sum(v);
    r[1] = simd_max(v);
    r[2] = simd_min(v);
    r[3] = simd_shuffle_down(v, 3u);
    r[4] = simd_prefix_exclusive_sum(v);
    r[5] = simd_prefix_inclusive_sum(v);
    r[6] = simd_broadcast(v, 5u);
    r[7] = simd_shuffle_xor(v, 1u);
    r[8] = simd_shuffle(v, ushort((lane + 7) % 32));
    r[9] = simd_shuffle_up(v, 2u);
    r[10] = lane < 16 ? simd_sum(v) : -1.0f;   // divergent: only lanes 0..15 take part
    r[11] = quad_sum(v);
    u[gid * 4 + 0] = simd_all(v > -100.0f) ? 1 : 0;
    u[gid * 4 + 1] = simd_any(v > 6.5f) ? 1 : 0;
    u[gid * 4 + 2] = uint(ulong(simd_ballot(v > 0.0f)));
    u[gid * 4 + 3] = simd_is_first() ? 1 : 0;
}

// divergent SIMD-group calls: the active lanes are those that take the call together, as on a GPU
inline float reduce_helper(float v) { return simd_sum(v); }
kernel void divergent(device const float* x [[buffer(0)]], device float* o [[buffer(1)]],
                      constant uint& n [[buffer(2)]], uint lane [[thread_index_in_simdgroup]]) {
    float m = 0.0f;
    for (uint i = lane; i < n; i += 32) m += simd_sum(x[i]);   // lanes leave the loop at different times
    float a = 0.0f, b = 0.0f;
    if (lane >= 16) a = simd_sum(1.0f);
    if (lane < 16) b = simd_sum(2.0f);
    o[lane] = reduce_helper(1.0f) * 1e6f + a * 1e4f + b * 100.0f + m;  // all 32 lanes again
}

kernel void softmax_rows(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                         constant uint& cols [[buffer(2)]], uint row [[threadgroup_position_in_grid]],
                         uint lid [[thread_position_in_threadgroup]], uint tgs [[threads_per_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                         uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float red[32];
    device const float* xr = x + row * cols;
    float m = -INFINITY;
    for (uint c = lid; c < cols; c += tgs) m = max(m, xr[c]);
    m = simd_max(m);
    if (lane == 0) red[sg] = m;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    m = red[0];
    for (uint k = 1; k < nsg; ++k) m = max(m, red[k]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float s = 0.0f;
    for (uint c = lid; c < cols; c += tgs) s += exp(xr[c] - m);
    s = simd_sum(s);
    if (lane == 0) red[sg] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    s = 0.0f;
    for (uint k = 0; k < nsg; ++k) s += red[k];
    for (uint c = lid; c < cols; c += tgs) y[row * cols + c] = exp(xr[c] - m) / s;
}

// one SIMD-group per 8x8 tile of C = A (MxK) * B (KxN); Bt holds B transposed (NxK)
kernel void mm8(device const float* A [[buffer(0)]], device const float* B [[buffer(1)]],
                device const float* Bt [[buffer(2)]], device float* C [[buffer(3)]], device float* Ct [[buffer(4)]],
                constant uint& M [[buffer(5)]], constant uint& N [[buffer(6)]], constant uint& K [[buffer(7)]],
                uint2 tg [[threadgroup_position_in_grid]]) {
    simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f), acc_t = simdgroup_float8x8(0.0f);
    simdgroup_float8x8 a, b, bt;
    for (uint k = 0; k < K; k += 8) {
        simdgroup_load(a, A, K, ulong2(k, tg.y * 8));
        simdgroup_load(b, B, N, ulong2(tg.x * 8, k));
        simdgroup_load(bt, Bt, K, ulong2(k, tg.x * 8), true);
        simdgroup_multiply_accumulate(acc, a, b, acc);
        simdgroup_multiply_accumulate(acc_t, a, bt, acc_t);
    }
    simdgroup_store(acc, C, N, ulong2(tg.x * 8, tg.y * 8));
    simdgroup_store(acc_t, Ct, N, ulong2(tg.x * 8, tg.y * 8));
}

kernel void uninit(device float* out [[buffer(0)]], uint lid [[thread_position_in_threadgroup]]) {
    threadgroup float t[64];
    if (lid == 0) t[0] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[lid] = t[lid];
}

kernel void too_big(device float* out [[buffer(0)]], uint lid [[thread_position_in_threadgroup]]) {
    threadgroup float big[9000];
    big[lid] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[lid] = big[0];
}
"""


@pytest.fixture(scope="session")
def libs(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("METAL_ACCEL_USER_CACHE", str(tmp_path_factory.mktemp("msl_emu_cache")))
        backend = MpsEmuBackend()
        return backend.compile(SRC_A), backend.compile(SRC_B)


@pytest.fixture
def a(libs):
    return libs[0]


@pytest.fixture
def b(libs):
    return libs[1]


def expected_ids(grid, group):
    """The built-in values each thread of a dispatchThreads(grid, group) sees (NREC per thread)."""
    g3, t3 = list(grid) + [1] * (3 - len(grid)), list(group) + [1] * (3 - len(group))
    ntg = [(g + t - 1) // t for g, t in zip(g3, t3)]
    out = []
    for z in range(g3[2]):
        for y in range(g3[1]):
            for x in range(g3[0]):
                pos = (x, y, z)
                tg = [p // t for p, t in zip(pos, t3)]
                lid = [p % t for p, t in zip(pos, t3)]
                actual = [min(t, g - q * t) for g, q, t in zip(g3, tg, t3)]
                tidx = lid[0] + actual[0] * (lid[1] + actual[1] * lid[2])
                out.append([x, y, z, *lid, *tg, actual[0], actual[1], t3[0],
                            ntg[0] * 10000 + ntg[1] * 100 + ntg[2], tidx, tidx % 32 + 100 * (tidx // 32), 32])
    return torch.tensor(out, dtype=torch.int64)


# ---------------------------------------------------------------- grids and launch convention

@pytest.mark.slow
@pytest.mark.parametrize("grid,group", [((100,), (32,)), ((10, 7), (4, 3)), ((5, 4, 3), (2, 3, 2)), ((70,), (64,))])
def test_grid_positions_and_nonuniform_last_groups(a, grid, group):
    out = torch.full((math.prod(grid) * 16,), 0xDEAD, dtype=torch.int32)
    a.ids(out, threads=list(grid), group_size=list(group))
    assert torch.equal(out.view(-1, 16).long(), expected_ids(grid, group))


def test_default_threads_and_group_size_follow_compile_shader(a):
    # threads defaults to the first tensor's numel; 1-D group defaults to min(threads, 1024)
    out = torch.zeros(2000 * 16, dtype=torch.int32)
    a.ids(out, threads=2000)
    assert torch.equal(out.view(-1, 16).long(), expected_ids((2000,), (1024,)))
    # 2-D: the group defaults to (1024, 1), so a 10-wide grid has one group per row
    out = torch.zeros(10 * 3 * 16, dtype=torch.int32)
    a.ids(out, threads=(10, 3))
    assert torch.equal(out.view(-1, 16).long(), expected_ids((10, 3), (1024, 1)))
    x, y = torch.randn(50), torch.full((50,), float("nan"))
    a.scale(x, y, 2.5)  # threads = numel of the first tensor argument (x)
    assert torch.equal(y, x * 2.5)


def test_buffers_bind_by_index_from_the_storage_offset(a):
    base = torch.arange(20, dtype=torch.float32)
    out = torch.zeros(16)
    a.scale(base[4:], out, 2.0, threads=16)  # a view binds from its storage offset, as compile_shader does
    assert torch.equal(out, base[4:] * 2)


def test_library_attributes_are_the_kernels(a):
    assert set(dir(a)) == set(a.kernel_names) == {"ids", "scale", "vecs", "halfs", "mathk", "bits", "hist",
                                                  "scaled_iota", "shape_code"}
    assert a.scale.max_threads_per_threadgroup == 1024 and a.scale.thread_execution_width == 32
    with pytest.raises(AttributeError, match="no kernel 'nope'"):
        a.nope
    assert "mps-emu" in known_backends() and get_backend("mps-emu").language == "msl"


def test_structs_lists_casts_and_host_names(a):
    o = torch.full((8,), float("nan"))
    params = torch.cat([torch.tensor([5], dtype=torch.int32).view(torch.uint8), torch.tensor([2.0]).view(torch.uint8)])
    a.scaled_iota(o, params)  # [[host_name]]; a struct parameter takes a tensor's bytes
    assert torch.equal(o[:5], torch.arange(5.0) * 2) and o[5:].isnan().all()
    with pytest.raises(KernelLaunchError, match='arg_casts=\\{1: "int32"\\}'):
        a.shape_code(o, [2, 3])  # a list of ints binds int64s: misread as uints on the GPU
    a.shape_code(o, [2, 3], arg_casts="int32")
    assert torch.equal(o, torch.full((8,), 23.0))


def test_launch_errors(a):
    x, out = torch.randn(8), torch.zeros(8)
    with pytest.raises(KernelLaunchError, match="dtype torch.float32, got torch.float64"):
        a.scale(x.double(), out, 1.0)
    with pytest.raises(KernelLaunchError, match="reads float"):
        a.scale(x, out, 2)  # an int binds 8 bytes of int64: misread as float on the GPU
    with pytest.raises(KernelLaunchError, match="exceeds the 1024-thread limit"):
        a.scale(x, out, 1.0, threads=2048, group_size=2048)
    with pytest.raises(KernelLaunchError, match="same number of dimensions"):
        a.scale(x, out, 1.0, threads=(8, 1), group_size=8)
    with pytest.raises(KernelLaunchError, match="1 to 3"):
        a.scale(x, out, 1.0, threads=(1, 1, 1, 1))
    with pytest.raises(KernelLaunchError, match="binds 3 buffer indices"):
        a.scale(x, out)
    with pytest.raises(KernelLaunchError, match="CPU tensors"):
        a.scale(x.to("meta"), out, 1.0)
    vals, bins, total = torch.zeros(4, dtype=torch.int32), torch.zeros(16, dtype=torch.int32), torch.zeros(1)
    with pytest.raises(KernelLaunchError, match="cannot hold -1"):
        a.hist(vals, bins, total, -1)  # uint parameter
    with pytest.raises(KernelLaunchError, match="Python int"):
        a.hist(vals, bins, total, 4.0)
    a.scale(torch.empty(0), torch.empty(0), 1.0)  # an empty grid runs nothing


# ---------------------------------------------------------------- types and functions

def test_vector_types_and_swizzles(a):
    torch.manual_seed(0)
    v = torch.randn(64, 4)
    out, iout = torch.full((64 * 4, 4), float("nan")), torch.zeros(64, 4, dtype=torch.int32)
    a.vecs(v, out, iout, [1.5, 0.25], threads=64)
    o = out.view(64, 4, 4)
    w = v.flip(1) * 1.5 + v - 0.25
    w[:, [0, 2]] = w[:, [2, 0]]
    torch.testing.assert_close(o[:, 0], w)
    torch.testing.assert_close(o[:, 1, :3], torch.linalg.cross(v[:, :3], torch.tensor([1.0, 2.0, 3.0]).expand(64, 3)))
    torch.testing.assert_close(o[:, 1, 3], (v * v).sum(1))
    torch.testing.assert_close(o[:, 2, 0], v[:, :2].norm(dim=1))
    torch.testing.assert_close(o[:, 2, 1], v[:, 0] / v.norm(dim=1))
    assert torch.equal(o[:, 2, 2], torch.where(v[:, 2] > v[:, 3], v[:, 1], v[:, 0]))
    assert torch.equal(o[:, 2, 3], (v > 0).all(1).float())
    q = v.clone(); q[:, :3] += 1; q[:, 3] = -q[:, 3]; q[:, [1, 3]] *= 2
    torch.testing.assert_close(o[:, 3], q)
    iv = (v * 10).trunc().int()
    exp_i = torch.stack([iv[:, 1] + 1, iv[:, 0] + 2, iv[:, 2],
                         torch.tensor([bin(abs(int(z))).count("1") for z in iv[:, 2]], dtype=torch.int32)], 1)
    assert torch.equal(iout, exp_i)


def test_half_and_bfloat_io(a):
    torch.manual_seed(1)
    h, bf = torch.randn(256).half(), torch.randn(256).bfloat16()
    ho, bo, fo = torch.empty(256, dtype=torch.half), torch.empty(256, dtype=torch.bfloat16), torch.empty(256)
    a.halfs(h, bf, ho, bo, fo, 0.75, arg_casts={5: "fp16"})
    t = (h.float() * 0.75).half()
    assert torch.equal(ho, ((h.float() * t.float()).half().float() + 1).half())  # rounded to half per operation
    assert torch.equal(bo, (bf.float() * bf.float()).bfloat16())
    assert torch.equal(fo, h.float() + bf.float())
    with pytest.raises(KernelLaunchError, match="fp16"):
        a.halfs(h, bf, ho, bo, fo, 0.75)  # a float binds 4 bytes of float32: misread as half


def test_math_functions_fast_and_precise(a):
    torch.manual_seed(2)
    x = torch.rand(512) * 6 - 3
    y = torch.rand(512) * 4 + 0.1
    o = torch.full((512 * 24,), float("nan"))
    a.mathk(x, y, o)
    r = o.view(512, 24)
    xd, yd = x.double(), y.double()
    ref = [xd.exp(), torch.exp2(xd), yd.log(), yd.sqrt(), yd.rsqrt(), xd.tanh(), xd.sin(), xd.cos(), yd ** xd,
           xd * yd + 1, xd.exp(), xd.tanh(), xd.floor(), xd.ceil(), xd.round(), xd.abs(), torch.minimum(xd, yd),
           xd.clamp(min=0), xd.clamp(-1, 1), xd + (yd - xd) * 0.25, (xd >= 0).double(),
           (lambda t: t * t * (3 - 2 * t))(((xd + 1) / 2).clamp(0, 1)), yd.log2() + yd.log10(), xd / yd + yd.sqrt()]
    for j, want in enumerate(ref):
        if j == 14:  # round() rounds halfway cases away from zero; none occur in this input
            assert not ((x.abs() % 1) == 0.5).any()
        torch.testing.assert_close(r[:, j].double(), want, rtol=2e-6, atol=1e-6, msg=f"function #{j}")


def test_as_type(a):
    x = torch.randn(100)
    u, h, back = torch.empty(100, dtype=torch.int32), torch.empty(200, dtype=torch.half), torch.empty(100)
    a.bits(x, u, h, back)
    assert torch.equal(u, x.view(torch.int32))
    assert torch.equal(h.view(torch.int32), x.view(torch.int32))
    assert torch.equal(back, -x)


def test_atomics_histogram(a, b):
    torch.manual_seed(3)
    vals = torch.randint(0, 1000, (5000,), dtype=torch.int32)
    want = torch.bincount(vals % 16, minlength=16).int()
    bins, total = torch.zeros(16, dtype=torch.int32), torch.zeros(1)
    a.hist(vals, bins, total, vals.numel(), threads=5120, group_size=256)
    assert torch.equal(bins, want)
    assert total.item() == pytest.approx(vals.double().sum().item(), rel=1e-6)
    bins = torch.zeros(16, dtype=torch.int32)
    b.hist_tg(vals, bins, vals.numel(), threads=5000, group_size=96)  # partial last group
    assert torch.equal(bins, want)


# ---------------------------------------------------------------- threadgroup memory, barriers, SIMD-groups

def test_fast_path_only_for_kernels_without_synchronization(a, b):
    assert not a.ids._k.uses_fibers and not a.hist._k.uses_fibers
    assert b.tree_sum._k.uses_fibers and b.simd_ops._k.uses_fibers  # simd_ops through a helper function


def test_tree_reduction_with_barriers(b):
    x = torch.randn(1000)
    out = torch.full((4,), float("nan"))
    b.tree_sum(x, out, 1000, threads=1024, group_size=256)
    torch.testing.assert_close(out, torch.nn.functional.pad(x, (0, 24)).view(4, 256).sum(1), rtol=1e-5, atol=1e-5)


def test_tiled_transpose(b):
    x = torch.randn(37, 53)
    out = torch.full((53, 37), float("nan"))
    b.transpose(x, out, 37, 53, threads=(64, 48), group_size=(16, 16))
    assert torch.equal(out, x.t())


def _lanes(x, fn):
    return torch.cat([fn(c) for c in x.view(-1, 32)])


def test_simd_functions(b):
    x = torch.randint(-8, 8, (128,)).float()  # small integers: every order of summation is exact
    o, u = torch.full((128 * 12,), float("nan")), torch.zeros(128 * 4, dtype=torch.int32)
    b.simd_ops(x, o, u, threads=128, group_size=64)
    r, uu = o.view(128, 12), u.view(128, 4)
    g = x.view(-1, 32)
    assert torch.equal(r[:, 0], g.sum(1).repeat_interleave(32))
    assert torch.equal(r[:, 1], g.max(1).values.repeat_interleave(32))
    assert torch.equal(r[:, 2], g.min(1).values.repeat_interleave(32))
    lane = torch.arange(32)
    assert torch.equal(r[:, 3], _lanes(x, lambda c: torch.where(lane + 3 < 32, c[(lane + 3) % 32], c)))
    assert torch.equal(r[:, 4], _lanes(x, lambda c: c.cumsum(0) - c))
    assert torch.equal(r[:, 5], _lanes(x, lambda c: c.cumsum(0)))
    assert torch.equal(r[:, 6], g[:, 5].repeat_interleave(32))
    assert torch.equal(r[:, 7], _lanes(x, lambda c: c[lane ^ 1]))
    assert torch.equal(r[:, 8], _lanes(x, lambda c: c[(lane + 7) % 32]))
    assert torch.equal(r[:, 9], _lanes(x, lambda c: torch.where(lane >= 2, c[(lane - 2) % 32], c)))
    assert torch.equal(r[:, 10], _lanes(x, lambda c: torch.where(lane < 16, c[:16].sum(), torch.tensor(-1.0))))
    assert torch.equal(r[:, 11], _lanes(x, lambda c: c.view(8, 4).sum(1).repeat_interleave(4)))
    assert torch.equal(uu[:, 0], torch.ones(128, dtype=torch.int32))
    assert torch.equal(uu[:, 1], (g > 6.5).any(1).int().repeat_interleave(32))
    ballot = [sum(1 << i for i in range(32) if c[i] > 0) for c in g]
    assert uu[:, 2].view(-1, 32)[:, 0].tolist() == [v - (1 << 32) if v >= 1 << 31 else v for v in ballot]
    assert torch.equal(uu[:, 3], (lane == 0).int().repeat(4))


def test_simd_functions_in_a_partial_simdgroup(b):
    # 80 threads in groups of 64: the second group has one SIMD-group of 16 lanes
    x = torch.randint(-8, 8, (80,)).float()
    o, u = torch.full((80 * 12,), float("nan")), torch.zeros(80 * 4, dtype=torch.int32)
    b.simd_ops(x, o, u, threads=80, group_size=64)
    tail = o.view(80, 12)[64:]
    assert torch.equal(tail[:, 0], x[64:].sum().expand(16))
    # shuffling down from a lane that does not exist is undefined on the GPU: the emulator returns NaN
    assert torch.equal(tail[:13, 3], x[67:80]) and tail[13:, 3].isnan().all()


def test_divergent_simd_calls_and_reconvergence(b):
    o = torch.zeros(32)
    b.divergent(torch.ones(40), o, 40, threads=32, group_size=32)
    lane = torch.arange(32)
    loop = torch.where(lane < 8, 40.0, 32.0)  # 32 lanes in the first iteration, 8 in the second
    assert torch.equal(o, 32e6 + torch.where(lane >= 16, 16e4, 32e2) + loop)


def test_softmax_rows(b):
    x = torch.randn(33, 300) * 4
    y = torch.full_like(x, float("nan"))
    b.softmax_rows(x, y, 300, threads=33 * 128, group_size=128)
    torch.testing.assert_close(y, torch.softmax(x, dim=1), rtol=1e-5, atol=1e-7)


def test_simdgroup_matrix_multiply_accumulate(b):
    torch.manual_seed(4)
    M, N, K = 24, 16, 32
    A, B = torch.randn(M, K), torch.randn(K, N)
    C, Ct = torch.full((M, N), float("nan")), torch.full((M, N), float("nan"))
    b.mm8(A, B, B.t().contiguous(), C, Ct, M, N, K, threads=(N // 8 * 32, M // 8), group_size=(32, 1))
    torch.testing.assert_close(C, A @ B, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(Ct, A @ B, rtol=1e-5, atol=1e-5)


def test_threadgroup_memory_is_poisoned_and_limited(b):
    out = torch.zeros(64)
    b.uninit(out, threads=64, group_size=64)  # memory no thread wrote reads as NaN, never as a lucky zero
    assert out[0] == 1.0 and out[1:].isnan().all()
    with pytest.raises(KernelLaunchError, match="36000 bytes of threadgroup memory"):
        b.too_big(torch.zeros(32), threads=32, group_size=32)


# ---------------------------------------------------------------- compile errors and the disk cache

@pytest.mark.parametrize("src,match", [
    ("kernel void k(texture2d<float> t [[texture(0)]], uint i [[thread_position_in_grid]]) {}", "textures"),
    ("template <typename T> kernel void k(device T* o) {}", "no kernel found.*host_name"),
    ("kernel void k(device float* o, uint i) { o[i] = 0; }", "thread-position attribute"),
    ('#include "other.h"\nkernel void k(device float* o) {}', "self-contained"),
    ("void helper() {}", "no kernel found"),
    ('kernel void k(device float* o) { system("true"); }', r"may not call system\(\)"),
    ('kernel void k(device float* o) { asm("nop"); }', "'asm' \\(not part of Metal\\)"),
])
def test_unsupported_features_are_compile_errors(src, match):
    with pytest.raises(CompileError, match=match):
        MpsEmuBackend().compile(HEAD + src)


def test_cpp_errors_point_at_the_metal_source():
    with pytest.raises(CompileError, match=r"kernel\.metal:4"):
        MpsEmuBackend().compile(HEAD + "kernel void k(device float* o [[buffer(0)]]) {\n  o[0] = undefined_name;\n}\n")


@pytest.mark.slow
def test_disk_cache_hit_on_second_compile():
    src = HEAD + "kernel void fill(device int* o, constant int& v, uint i [[thread_position_in_grid]]) { o[i] = v; }\n"
    mps_emu.clear_memory_cache()
    before = mps_emu.compile_count
    lib = MpsEmuBackend().compile(src)
    assert mps_emu.compile_count == before + 1 and lib._compiled_now
    mps_emu.clear_memory_cache()
    again = MpsEmuBackend().compile(src)
    assert mps_emu.compile_count == before + 1 and not again._compiled_now
    o = torch.zeros(10, dtype=torch.int32)
    again.fill(o, 7)
    assert torch.equal(o, torch.full((10,), 7, dtype=torch.int32))
