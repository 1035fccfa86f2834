SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// RMSNorm over the last dimension, x * rsqrt(mean(x^2) + eps) * w: one threadgroup per row.
// Squares are summed in float, as eager's x.pow(2).mean() (an overflowing square is Inf there too),
// reduced with simd_sum and one barrier; the output is rounded as eager's (x * inv) * w.
inline float group_sum(float v, threadgroup float* part, uint lane, uint sg, uint nsg) {
    v = simd_sum(v);
    if (lane == 0) part[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = 0.0f;
    for (uint i = 0; i < nsg; ++i) t += part[i];
    return t;
}

kernel void rmsnorm(device const float* x [[buffer(0)]], device const float* w [[buffer(1)]],
                    device float* y [[buffer(2)]], constant uint& D [[buffer(3)]],
                    constant float& eps [[buffer(4)]],
                    uint row [[threadgroup_position_in_grid]], uint tid [[thread_position_in_threadgroup]],
                    uint tpg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                    uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float part[32];
    device const float* xr = x + (ulong)row * D;
    device float* yr = y + (ulong)row * D;
    float ss = 0.0f;
    for (uint j = tid; j < D; j += tpg) { const float v = xr[j]; ss += v * v; }
    const float inv = rsqrt(group_sum(ss, part, lane, sg, nsg) / float(D) + eps);
    for (uint j = tid; j < D; j += tpg) yr[j] = xr[j] * inv * w[j];
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    D = x.shape[-1]
    rows = x.numel() // D
    xc = x.contiguous()
    y = torch.empty_like(xc)
    tg = min(256, max(32, (D // 4 + 31) // 32 * 32))
    lib.rmsnorm(xc, module.weight, y, D, float(module.eps), threads=rows * tg, group_size=tg)
    return y
