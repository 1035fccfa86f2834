SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// Softmax over the last dimension: one threadgroup per row; max, then the sum of exp(x - max),
// then exp(x - max) / sum (x is read three times; rows stay in cache). A NaN or +Inf in a row makes
// the whole row NaN, as in eager.
inline float group_reduce(float v, threadgroup float* part, uint lane, uint sg, uint nsg, bool is_max) {
    v = is_max ? simd_max(v) : simd_sum(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);  // part may still be read by the previous reduction
    if (lane == 0) part[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = part[0];
    for (uint i = 1; i < nsg; ++i) t = is_max ? max(t, part[i]) : t + part[i];
    return t;
}

kernel void softmax_rows(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                         constant uint& D [[buffer(2)]],
                         uint row [[threadgroup_position_in_grid]], uint tid [[thread_position_in_threadgroup]],
                         uint tpg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float part[32];
    device const float* xr = x + (ulong)row * D;
    device float* yr = y + (ulong)row * D;
    float m = -INFINITY;
    for (uint j = tid; j < D; j += tpg) m = max(m, xr[j]);
    m = group_reduce(m, part, lane, sg, nsg, true);
    float s = 0.0f;
    for (uint j = tid; j < D; j += tpg) s += exp(xr[j] - m);
    s = group_reduce(s, part, lane, sg, nsg, false);
    for (uint j = tid; j < D; j += tpg) yr[j] = exp(xr[j] - m) / s;
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    D = x.shape[-1]
    rows = x.numel() // D
    xc = x.contiguous()
    y = torch.empty_like(xc)
    tg = min(256, max(32, (D // 4 + 31) // 32 * 32))
    lib.softmax_rows(xc, y, D, threads=rows * tg, group_size=tg)
    return y
