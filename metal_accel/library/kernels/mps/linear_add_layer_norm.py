"""LayerNorm(dense(x) + residual), dropout off, as BERT's and RoBERTa's SelfOutput and Output compute it. The GEMM
with its bias stays with torch (F.linear, as eager runs it); one kernel then adds the residual and normalizes in
place over the GEMM's output, one threadgroup per row: the sum rounded to x's dtype (as eager's add stores it), its
mean and biased variance in float with simd_sum, and y = (s - mean) * rsqrt(var + eps) * ln_weight + ln_bias
rounded once, as float4/half4/bfloat4 vectors where rows are 16-byte aligned. Eager's add and LayerNorm are two
kernels with the sum written and read between them. Served: x and residual (the GEMM output's shape) float32,
float16 or bfloat16 with ln_weight and ln_bias of x's dtype or float32; anything else runs the reference in torch."""
SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// Sum of v over the threadgroup: simd_sum, one partial per SIMD-group, one barrier, every thread adds them. Each
// reduction of a kernel has its own PART, so the second never overwrites partials the first still reads.
inline float group_sum(float v, threadgroup float* part, uint lane, uint sg, uint nsg) {
    v = simd_sum(v);
    if (lane == 0) part[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = 0.0f;
    for (uint i = 0; i < nsg; ++i) t += part[i];
    return t;
}

// The threadgroup's sum and largest value of (s, m), reduced together: one barrier.
inline float2 group_sum_max(float s, float m, threadgroup float2* part, uint lane, uint sg, uint nsg) {
    s = simd_sum(s);
    m = simd_max(m);
    if (lane == 0) part[sg] = float2(s, m);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float2 t = float2(0.0f, 0.0f);
    for (uint i = 0; i < nsg; ++i) t = float2(t.x + part[i].x, fmax(t.y, part[i].y));
    return t;
}

// The mean sums x * 2^-32 (exact: a power of two) and scales back, so no partial sum overflows where the mean does
// not. Rows over 2^48 in magnitude (no real activation), whose squared deviations could overflow float, take
// huge_row (below): float64's answer where eager's float32 variance overflows.
constant float BIG = 281474976710656.0f;      // 2^48
constant float SMALL = 7.888609052210118e-31f;  // 2^-100
constant float SUM_SCALE = 2.3283064365386963e-10f;  // 2^-32
constant float SUM_UNSCALE = 4294967296.0f;  // 2^32

// The threadgroup's largest value: simd_max, one partial per SIMD-group, one barrier.
inline float group_max(float v, threadgroup float* part, uint lane, uint sg, uint nsg) {
    v = simd_max(v);
    if (lane == 0) part[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = part[0];
    for (uint i = 1; i < nsg; ++i) t = fmax(t, part[i]);
    return t;
}

// A row over 2^48 in magnitude (no real activation; eager's float32 variance overflows there), called by the whole
// threadgroup: the statistics of u = x * 2^-100 (exact: a power of two), its sum shifted by the row's largest u (an
// element, so a constant row's deviations are exactly 0: a float mean one ulp off would normalize to +-1), then
// y = (u - mean_u) * rsqrt(var_u) * w + b, which is (x - mean) * rsqrt(var + eps) * w + b with eps negligible (a
// nonzero var is over 2^48 here) and 0 * w + b for a zero var: float64's answer. Scalar loads; every pass reads
// what the same thread read before, except the first, behind the caller's device barrier where x was just written.
template <typename T, typename W>
inline void huge_row(device const T* xr, device const W* w, device const W* b, device T* yr, uint D, uint tid,
                     uint tpg, threadgroup float* part_p, threadgroup float* part_s, threadgroup float* part_q,
                     uint lane, uint sg, uint nsg) {
    float p = -3.402823466e38f;
    for (uint j = tid; j < D; j += tpg) p = fmax(p, float(xr[j]) * SMALL);
    p = group_max(p, part_p, lane, sg, nsg);
    float s = 0.0f;
    for (uint j = tid; j < D; j += tpg) s += float(xr[j]) * SMALL - p;
    const float mean_u = p + group_sum(s, part_s, lane, sg, nsg) / float(D);
    float q = 0.0f;
    for (uint j = tid; j < D; j += tpg) { const float d = float(xr[j]) * SMALL - mean_u; q += d * d; }
    const float var_u = group_sum(q, part_q, lane, sg, nsg) / float(D);
    const float inv = var_u > 0.0f ? rsqrt(var_u) : 0.0f;
    for (uint j = tid; j < D; j += tpg) yr[j] = T(float(w[j]) * ((float(xr[j]) * SMALL - mean_u) * inv) + float(b[j]));
}

// One threadgroup per row of h (the GEMM's output, D elements of T), in place: h = T(h + r) (the sum rounded to T, as
// eager's add stores it), then h = (h - mean) * rsqrt(var + eps) * w + b with the mean and the biased variance in
// float, rounded once to T. Every element is read and written by one thread only (the same j in each pass), so the
// passes need no barrier but the reductions'. r: rows of T like h; w, b: D of W. vec_ok != 0: D % 4 == 0 and every
// row starts 16-byte aligned (offsets multiples of 4).
template <typename T, typename W>
kernel void add_layer_norm(device T* h [[buffer(0)]], device const T* r [[buffer(1)]],
                           device const W* w [[buffer(2)]], device const W* b [[buffer(3)]],
                           constant uint& D [[buffer(4)]], constant float& eps [[buffer(5)]],
                           constant uint& vec_ok [[buffer(6)]],
                           uint row [[threadgroup_position_in_grid]], uint tid [[thread_position_in_threadgroup]],
                           uint tpg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float2 part_mean[32];
    threadgroup float part_var[32], part_hp[32], part_hs[32], part_hq[32];
    device T* hr = h + (ulong)row * D;
    device const T* rr = r + (ulong)row * D;
    float s = 0.0f;
    float m = 0.0f;
    float q = 0.0f;
    if (vec_ok != 0) {
        const uint n4 = D / 4;
        device vec<T, 4>* h4 = (device vec<T, 4>*)hr;
        device const vec<T, 4>* r4 = (device const vec<T, 4>*)rr;
        for (uint j = tid; j < n4; j += tpg) {
            const vec<T, 4> t = vec<T, 4>(float4(h4[j]) + float4(r4[j]));
            h4[j] = t;
            const float4 f = float4(t);
            const float4 v = f * SUM_SCALE;
            s += (v.x + v.y) + (v.z + v.w);
            m = fmax(m, fmax(fmax(abs(f.x), abs(f.y)), fmax(abs(f.z), abs(f.w))));
        }
        const float2 sm = group_sum_max(s, m, part_mean, lane, sg, nsg);
        if (sm.y > BIG) {
            threadgroup_barrier(mem_flags::mem_device);  // h + r was written by other threads
            huge_row(hr, w, b, hr, D, tid, tpg, part_hp, part_hs, part_hq, lane, sg, nsg);
            return;
        }
        const float mean = sm.x / float(D) * SUM_UNSCALE;
        for (uint j = tid; j < n4; j += tpg) {
            const float4 d = (float4(h4[j]) - mean);
            q += (d.x * d.x + d.y * d.y) + (d.z * d.z + d.w * d.w);
        }
        const float rstd = rsqrt(group_sum(q, part_var, lane, sg, nsg) / float(D) + eps);
        device const vec<W, 4>* w4 = (device const vec<W, 4>*)w;
        device const vec<W, 4>* b4 = (device const vec<W, 4>*)b;
        for (uint j = tid; j < n4; j += tpg)
            h4[j] = vec<T, 4>(float4(w4[j]) * ((float4(h4[j]) - mean) * rstd) + float4(b4[j]));
    } else {
        for (uint j = tid; j < D; j += tpg) {
            const T t = T(float(hr[j]) + float(rr[j]));
            hr[j] = t;
            s += float(t) * SUM_SCALE;
            m = fmax(m, abs(float(t)));
        }
        const float2 sm = group_sum_max(s, m, part_mean, lane, sg, nsg);
        if (sm.y > BIG) {
            threadgroup_barrier(mem_flags::mem_device);  // h + r was written by other threads
            huge_row(hr, w, b, hr, D, tid, tpg, part_hp, part_hs, part_hq, lane, sg, nsg);
            return;
        }
        const float mean = sm.x / float(D) * SUM_UNSCALE;
        for (uint j = tid; j < D; j += tpg) { const float d = (float(hr[j]) - mean); q += d * d; }
        const float rstd = rsqrt(group_sum(q, part_var, lane, sg, nsg) / float(D) + eps);
        for (uint j = tid; j < D; j += tpg) hr[j] = T(float(w[j]) * ((float(hr[j]) - mean) * rstd) + float(b[j]));
    }
}

#define ADD_LAYER_NORM(NAME, T, W) \
    template [[host_name(NAME)]] [[kernel]] decltype(add_layer_norm<T, W>) add_layer_norm<T, W>;
ADD_LAYER_NORM("add_layer_norm_f32_f32", float, float)
ADD_LAYER_NORM("add_layer_norm_f16_f16", half, half)
ADD_LAYER_NORM("add_layer_norm_f16_f32", half, float)
ADD_LAYER_NORM("add_layer_norm_bf16_bf16", bfloat, bfloat)
ADD_LAYER_NORM("add_layer_norm_bf16_f32", bfloat, float)
"""


def linear_add_layer_norm(x, residual, weight, bias, ln_weight, ln_bias, eps):
    h = F.linear(x, weight, bias)
    D = h.shape[-1]
    served = h.dtype in (torch.float32, torch.float16, torch.bfloat16) and h.dtype == x.dtype \
        and residual.dtype == h.dtype and tuple(residual.shape) == tuple(h.shape) and ln_weight.dtype == ln_bias.dtype \
        and ln_weight.dtype in (h.dtype, torch.float32) and ln_weight.dim() == 1 and ln_bias.dim() == 1 \
        and ln_weight.numel() == D and ln_bias.numel() == D and D > 0 and h.numel() > 0
    if not served:
        return F.layer_norm(h + residual, (ln_weight.shape[0],), ln_weight, ln_bias, eps)
    h = h.contiguous()
    r = residual.contiguous()
    w = ln_weight.contiguous()
    b = ln_bias.contiguous()
    rows = h.numel() // D
    vec = 1 if D % 4 == 0 and h.storage_offset() % 4 == 0 and r.storage_offset() % 4 == 0 \
        and w.storage_offset() % 4 == 0 and b.storage_offset() % 4 == 0 else 0
    tg = min(1024, max(32, ((D // 4 if vec else D) + 31) // 32 * 32))
    n = rows * tg
    if h.dtype == torch.float32:
        lib.add_layer_norm_f32_f32(h, r, w, b, D, float(eps), vec, threads=n, group_size=tg)
    elif h.dtype == torch.float16 and w.dtype == torch.float16:
        lib.add_layer_norm_f16_f16(h, r, w, b, D, float(eps), vec, threads=n, group_size=tg)
    elif h.dtype == torch.float16:
        lib.add_layer_norm_f16_f32(h, r, w, b, D, float(eps), vec, threads=n, group_size=tg)
    elif w.dtype == torch.bfloat16:
        lib.add_layer_norm_bf16_bf16(h, r, w, b, D, float(eps), vec, threads=n, group_size=tg)
    else:
        lib.add_layer_norm_bf16_f32(h, r, w, b, D, float(eps), vec, threads=n, group_size=tg)
    return h
