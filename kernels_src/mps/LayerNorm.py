SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// LayerNorm over the last dimension: one threadgroup per row, two passes over the row (mean, then
// the centred sum of squares). Metal has no double: the mean sums x * (1/D), which cannot overflow
// for finite x, so huge finite values behave as in eager's Welford (an Inf variance gives rstd 0).
// The output is eager's (x * rstd + (-mean * rstd)) * w + b.
inline float group_sum(float v, threadgroup float* part, uint lane, uint sg, uint nsg) {
    v = simd_sum(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);  // part may still be read by the previous sum
    if (lane == 0) part[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = 0.0f;
    for (uint i = 0; i < nsg; ++i) t += part[i];
    return t;
}

kernel void layernorm(device const float* x [[buffer(0)]], device const float* w [[buffer(1)]],
                      device const float* b [[buffer(2)]], device float* y [[buffer(3)]],
                      constant uint& D [[buffer(4)]], constant float& eps [[buffer(5)]],
                      uint row [[threadgroup_position_in_grid]], uint tid [[thread_position_in_threadgroup]],
                      uint tpg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float part[32];
    device const float* xr = x + (ulong)row * D;
    device float* yr = y + (ulong)row * D;
    const float invD = 1.0f / float(D);
    float s = 0.0f;
    for (uint j = tid; j < D; j += tpg) s += xr[j] * invD;
    const float mean = group_sum(s, part, lane, sg, nsg);
    float q = 0.0f;
    for (uint j = tid; j < D; j += tpg) { const float c = xr[j] - mean; q += c * c; }
    const float var = group_sum(q, part, lane, sg, nsg) * invD;
    const float rstd = rsqrt(max(var, 0.0f) + eps);
    const float shift = -mean * rstd;
    for (uint j = tid; j < D; j += tpg) yr[j] = (xr[j] * rstd + shift) * w[j] + b[j];
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    D = x.shape[-1]
    rows = x.numel() // D
    xc = x.contiguous()
    y = torch.empty_like(xc)
    tg = min(256, max(32, (D // 4 + 31) // 32 * 32))
    lib.layernorm(xc, module.weight, module.bias, y, D, float(module.eps), threads=rows * tg, group_size=tg)
    return y
