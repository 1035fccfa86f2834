"""LayerNorm over the last dimension with weight and bias, as nn.LayerNorm computes it (BERT, GPT-2's ln_1, ln_2 and
ln_f, ViT): y = (x - mean) * rsqrt(var + eps) * weight + bias, the mean and the biased variance in float, the output
in x's dtype. One threadgroup per row reads the row as float4/half4/bfloat4 vectors where rows are 16-byte aligned
(scalars otherwise), sums it and then its squared deviations with simd_sum and one barrier each, and writes the
output in a third pass (the second and third read the row from cache). Served: x float32, float16 or bfloat16 with
weight and bias of x's dtype or float32 (the output x's dtype and contiguous, as eager's); other dtype pairs run
F.layer_norm."""
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

// One threadgroup per row of x (D elements of T); w, b: D of W; y: rows of T, contiguous. mean and the biased
// variance in float (two passes over the row, the second from cache), y = (x - mean) * rsqrt(var + eps) * w + b in
// float, rounded once to T. vec_ok != 0: D % 4 == 0 and every row starts 16-byte aligned (offsets multiples of 4).
template <typename T, typename W>
kernel void layer_norm(device const T* x [[buffer(0)]], device const W* w [[buffer(1)]],
                       device const W* b [[buffer(2)]], device T* y [[buffer(3)]], constant uint& D [[buffer(4)]],
                       constant float& eps [[buffer(5)]], constant uint& vec_ok [[buffer(6)]],
                       uint row [[threadgroup_position_in_grid]], uint tid [[thread_position_in_threadgroup]],
                       uint tpg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                       uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float2 part_mean[32];
    threadgroup float part_var[32], part_hp[32], part_hs[32], part_hq[32];
    device const T* xr = x + (ulong)row * D;
    device T* yr = y + (ulong)row * D;
    float s = 0.0f;
    float m = 0.0f;
    float q = 0.0f;
    if (vec_ok != 0) {
        const uint n4 = D / 4;
        device const vec<T, 4>* x4 = (device const vec<T, 4>*)xr;
        for (uint j = tid; j < n4; j += tpg) {
            const float4 f = float4(x4[j]);
            const float4 v = f * SUM_SCALE;
            s += (v.x + v.y) + (v.z + v.w);
            m = fmax(m, fmax(fmax(abs(f.x), abs(f.y)), fmax(abs(f.z), abs(f.w))));
        }
        const float2 sm = group_sum_max(s, m, part_mean, lane, sg, nsg);
        if (sm.y > BIG) {
            huge_row(xr, w, b, yr, D, tid, tpg, part_hp, part_hs, part_hq, lane, sg, nsg);
            return;
        }
        const float mean = sm.x / float(D) * SUM_UNSCALE;
        for (uint j = tid; j < n4; j += tpg) {
            const float4 d = (float4(x4[j]) - mean);
            q += (d.x * d.x + d.y * d.y) + (d.z * d.z + d.w * d.w);
        }
        const float rstd = rsqrt(group_sum(q, part_var, lane, sg, nsg) / float(D) + eps);
        device const vec<W, 4>* w4 = (device const vec<W, 4>*)w;
        device const vec<W, 4>* b4 = (device const vec<W, 4>*)b;
        device vec<T, 4>* y4 = (device vec<T, 4>*)yr;
        for (uint j = tid; j < n4; j += tpg)
            y4[j] = vec<T, 4>(float4(w4[j]) * ((float4(x4[j]) - mean) * rstd) + float4(b4[j]));
    } else {
        for (uint j = tid; j < D; j += tpg) {
            const float f = float(xr[j]);
            s += f * SUM_SCALE;
            m = fmax(m, abs(f));
        }
        const float2 sm = group_sum_max(s, m, part_mean, lane, sg, nsg);
        if (sm.y > BIG) {
            huge_row(xr, w, b, yr, D, tid, tpg, part_hp, part_hs, part_hq, lane, sg, nsg);
            return;
        }
        const float mean = sm.x / float(D) * SUM_UNSCALE;
        for (uint j = tid; j < D; j += tpg) { const float d = (float(xr[j]) - mean); q += d * d; }
        const float rstd = rsqrt(group_sum(q, part_var, lane, sg, nsg) / float(D) + eps);
        for (uint j = tid; j < D; j += tpg) yr[j] = T(float(w[j]) * ((float(xr[j]) - mean) * rstd) + float(b[j]));
    }
}

#define LAYER_NORM(NAME, T, W) \
    template [[host_name(NAME)]] [[kernel]] decltype(layer_norm<T, W>) layer_norm<T, W>;
LAYER_NORM("layer_norm_f32_f32", float, float)
LAYER_NORM("layer_norm_f16_f16", half, half)
LAYER_NORM("layer_norm_f16_f32", half, float)
LAYER_NORM("layer_norm_bf16_bf16", bfloat, bfloat)
LAYER_NORM("layer_norm_bf16_f32", bfloat, float)
"""


def layer_norm(x, weight, bias, eps):
    D = x.shape[-1]
    served = x.dtype in (torch.float32, torch.float16, torch.bfloat16) and weight.dtype == bias.dtype \
        and weight.dtype in (x.dtype, torch.float32) and weight.dim() == 1 and bias.dim() == 1 \
        and weight.numel() == D and bias.numel() == D and D > 0
    if not served:
        return F.layer_norm(x, (weight.shape[0],), weight, bias, eps)
    xc = x.contiguous()
    w = weight.contiguous()
    b = bias.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # eager's output is contiguous
    rows = xc.numel() // D
    if rows == 0:
        return out
    vec = 1 if D % 4 == 0 and xc.storage_offset() % 4 == 0 and w.storage_offset() % 4 == 0 \
        and b.storage_offset() % 4 == 0 else 0
    tg = min(1024, max(32, ((D // 4 if vec else D) + 31) // 32 * 32))
    n = rows * tg
    if x.dtype == torch.float32:
        lib.layer_norm_f32_f32(xc, w, b, out, D, float(eps), vec, threads=n, group_size=tg)
    elif x.dtype == torch.float16 and w.dtype == torch.float16:
        lib.layer_norm_f16_f16(xc, w, b, out, D, float(eps), vec, threads=n, group_size=tg)
    elif x.dtype == torch.float16:
        lib.layer_norm_f16_f32(xc, w, b, out, D, float(eps), vec, threads=n, group_size=tg)
    elif w.dtype == torch.bfloat16:
        lib.layer_norm_bf16_bf16(xc, w, b, out, D, float(eps), vec, threads=n, group_size=tg)
    else:
        lib.layer_norm_bf16_f32(xc, w, b, out, D, float(eps), vec, threads=n, group_size=tg)
    return out
