"""RMSNorm over the last dimension as HF Llama/Qwen2/Mistral compute it: weight * (x * rsqrt(mean(x^2) + eps))
rounded to x's dtype first. One threadgroup per row reads the row as float4/half4/bfloat4 vectors where rows are
16-byte aligned (scalars otherwise), sums squares in float with simd_sum and one barrier, and writes the output in
one more pass: two reads and one write of the row against eager's six kernels and three float32 intermediates.
Served: x float32, float16 or bfloat16 with weight of x's dtype or float32 (output of the promoted dtype);
other dtype pairs run the same computation in torch."""
SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// Sum of v over the threadgroup: simd_sum, one partial per SIMD-group, one barrier, every thread adds them.
inline float group_sum(float v, threadgroup float* part, uint lane, uint sg, uint nsg) {
    v = simd_sum(v);
    if (lane == 0) part[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = 0.0f;
    for (uint i = 0; i < nsg; ++i) t += part[i];
    return t;
}

// x: rows of D elements of T; w: D of W; y: rows of O = promote(T, W). Rounding as eager: h = x * inv in float,
// rounded to T, then w * h in float (exact for O = half: a product of two halves fits a float), rounded to O.
// vec_ok != 0: D % 4 == 0 and every row starts 16-byte aligned (element offsets multiples of 4).
template <typename T, typename W, typename O>
kernel void rms_norm(device const T* x [[buffer(0)]], device const W* w [[buffer(1)]], device O* y [[buffer(2)]],
                     constant uint& D [[buffer(3)]], constant float& eps [[buffer(4)]],
                     constant uint& vec_ok [[buffer(5)]],
                     uint row [[threadgroup_position_in_grid]], uint tid [[thread_position_in_threadgroup]],
                     uint tpg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                     uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float part[32];
    device const T* xr = x + (ulong)row * D;
    device O* yr = y + (ulong)row * D;
    float ss = 0.0f;
    if (vec_ok != 0) {
        const uint n4 = D / 4;
        device const vec<T, 4>* x4 = (device const vec<T, 4>*)xr;
        for (uint j = tid; j < n4; j += tpg) {
            const float4 v = float4(x4[j]);
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        const float inv = rsqrt(group_sum(ss, part, lane, sg, nsg) / float(D) + eps);
        device const vec<W, 4>* w4 = (device const vec<W, 4>*)w;
        device vec<O, 4>* y4 = (device vec<O, 4>*)yr;
        for (uint j = tid; j < n4; j += tpg) {
            const float4 h = float4(vec<T, 4>(float4(x4[j]) * inv));
            y4[j] = vec<O, 4>(float4(w4[j]) * h);
        }
    } else {
        for (uint j = tid; j < D; j += tpg) { const float v = float(xr[j]); ss += v * v; }
        const float inv = rsqrt(group_sum(ss, part, lane, sg, nsg) / float(D) + eps);
        for (uint j = tid; j < D; j += tpg) yr[j] = O(float(w[j]) * float(T(float(xr[j]) * inv)));
    }
}

#define RMS_NORM(NAME, T, W, O) \
    template [[host_name(NAME)]] [[kernel]] decltype(rms_norm<T, W, O>) rms_norm<T, W, O>;
RMS_NORM("rms_norm_f32_f32", float, float, float)
RMS_NORM("rms_norm_f16_f16", half, half, half)
RMS_NORM("rms_norm_f16_f32", half, float, float)
RMS_NORM("rms_norm_bf16_bf16", bfloat, bfloat, bfloat)
RMS_NORM("rms_norm_bf16_f32", bfloat, float, float)
"""


def rms_norm(x, weight, eps):
    D = x.shape[-1]
    served = x.dtype in (torch.float32, torch.float16, torch.bfloat16) and weight.dtype in (x.dtype, torch.float32)
    if not served or weight.numel() != D:
        h = x.to(torch.float32)
        h = h * (h.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
        return weight * h.to(x.dtype)
    xc = x.contiguous()
    w = weight.contiguous()
    out = torch.empty_like(x, dtype=weight.dtype)  # eager's layout: x's strides where x is dense
    rows = xc.numel() // D if D > 0 else 0
    if rows == 0:
        return out
    y = out if out.is_contiguous() else torch.empty(x.shape, dtype=weight.dtype, device=x.device)
    vec = 1 if D % 4 == 0 and xc.storage_offset() % 4 == 0 and w.storage_offset() % 4 == 0 else 0
    tg = min(1024, max(32, ((D // 4 if vec else D) + 31) // 32 * 32))
    n = rows * tg
    if x.dtype == torch.float32:
        lib.rms_norm_f32_f32(xc, w, y, D, float(eps), vec, threads=n, group_size=tg)
    elif x.dtype == torch.float16 and weight.dtype == torch.float16:
        lib.rms_norm_f16_f16(xc, w, y, D, float(eps), vec, threads=n, group_size=tg)
    elif x.dtype == torch.float16:
        lib.rms_norm_f16_f32(xc, w, y, D, float(eps), vec, threads=n, group_size=tg)
    elif weight.dtype == torch.bfloat16:
        lib.rms_norm_bf16_bf16(xc, w, y, D, float(eps), vec, threads=n, group_size=tg)
    else:
        lib.rms_norm_bf16_f32(xc, w, y, D, float(eps), vec, threads=n, group_size=tg)
    if y is not out:
        out.copy_(y)
    return out
