"""Valid Metal the emulator's translator once rejected (found by kernels written in the idioms of ggml and MLX):
an array of pointers to a template type (`device const T * ax[N]`, ggml's mul_mv), an instantiation whose
arguments end in `>>` (`decltype(f<float, Op<float>>) f<float, Op<float>>`, MLX's instantiate_kernel), and a
divisor that is a template-id (`a / Traits<4>::pack`, `a / max<int>(b, 1)`), an unnamed pointer-to-array type in a
cast (`(threadgroup float (*)[9]) flat`); `a / b < c` stays a comparison."""
from __future__ import annotations

import pytest
import torch

from metal_accel.backends.mps_emu.backend import MpsEmuBackend

pytestmark = [pytest.mark.needs_cxx, pytest.mark.slow,
              pytest.mark.skipif(not MpsEmuBackend().is_available(), reason="no C++ compiler")]

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

template <typename T, int N>
void row_sums(device const char * base, device float * out, uint i) {
    device const T * rows[N];
    for (int r = 0; r < N; ++r) rows[r] = (device const T *) (base + r * 4 * sizeof(T));
    float s = 0.0f;
    for (int r = 0; r < N; ++r) s += float(rows[r][i]);
    out[i] = s;
}

kernel void sum_two_rows(device const char * base [[buffer(0)]], device float * out [[buffer(1)]],
                         uint i [[thread_position_in_grid]]) {
    row_sums<float, 2>(base, out, i);
}

template <typename T> struct Tripled { static T apply(T x) { return x * T(3); } };

template <typename T, typename Op>
[[kernel]] void unary(device const T * in [[buffer(0)]], device T * out [[buffer(1)]],
                      uint i [[thread_position_in_grid]]) {
    out[i] = Op::apply(in[i]);
}
template [[host_name("tripled_f32")]] [[kernel]] decltype(unary<float, Tripled<float>>) unary<float, Tripled<float>>;

template <int bits> struct Packing { static constexpr constant int per_word = 32 / bits; };

kernel void transpose8(device const float * in [[buffer(0)]], device float * out [[buffer(1)]],
                       uint2 lid [[thread_position_in_threadgroup]]) {
    threadgroup float flat[8 * 9];
    threadgroup float (*tile)[9] = (threadgroup float (*)[9]) flat;
    tile[lid.y][lid.x] = in[lid.y * 8 + lid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[lid.y * 8 + lid.x] = tile[lid.x][lid.y];
}

kernel void divide(device const int * a [[buffer(0)]], device int * out [[buffer(1)]],
                   uint i [[thread_position_in_grid]]) {
    int by_traits = a[i] / Packing<4>::per_word;
    int by_call = a[i] / max<int>(int(i), 1);
    int compared = a[i] / 8 < int(i) ? 1 : 0;
    out[3 * i] = by_traits;
    out[3 * i + 1] = by_call;
    out[3 * i + 2] = compared;
}
"""


def test_ggml_and_mlx_declarators_and_template_ids_compile_and_compute():
    lib = MpsEmuBackend().compile(SOURCE)
    x = torch.randn(8)
    out = torch.empty(4)
    lib.sum_two_rows(x, out, threads=4)
    torch.testing.assert_close(out, x[:4] + x[4:])
    y = torch.empty(8)
    lib.tripled_f32(x, y)
    torch.testing.assert_close(y, x * 3)
    a = torch.arange(16, dtype=torch.int32) * 7
    got = torch.empty(48, dtype=torch.int32)
    lib.divide(a, got, threads=16)
    i = torch.arange(16, dtype=torch.int32)
    want = torch.stack([a // 8, a // i.clamp(min=1), (a // 8 < i).int()], dim=1).reshape(-1)
    torch.testing.assert_close(got, want)
    m = torch.randn(8, 8)
    t = torch.empty(64)
    lib.transpose8(m.reshape(-1), t, threads=(8, 8), group_size=(8, 8))
    torch.testing.assert_close(t.view(8, 8), m.t())
