"""attention_decode (HF sdpa_attention_forward for one query token over a KV cache, grouped-query heads):
out[b, 0, h] = softmax(scale * q[b, h] . k[b, h // G]^T + mask[b, h]) @ v[b, h // G], G = Hq / Hkv.

One threadgroup per (batch, query head): its threads score the keys (one key a thread at a time, the scores
kept in a float scratch row), reduce the max and the sum of the weights with simd_max/simd_sum and one barrier
each, then each thread sums the weighted values of its output columns (reads coalesced over the columns), all
in float, rounded once to the output dtype. The key heads are indexed through the grouping, never copied
(eager's GQA path repacks or expands them). Fully masked rows give 0, as torch's SDPA does. Served: q_len 1,
q/k/v float32, float16 or bfloat16 of one dtype, contiguous key/value [B, Hkv, L, D], mask None, bool, or
additive of q's dtype shaped [1 or B, 1 or Hq, 1, L]; anything else runs torch's SDPA (the same computation,
unfused).
"""
SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

inline float nanmax(float a, float b) { return (a > b || a != a) ? a : b; }

// max (NaN kept) and sum over the threadgroup: a SIMD-group reduction, one partial per SIMD-group, one barrier
inline float group_max(float v, threadgroup float* part, uint lane, uint sg, uint nsg) {
    for (ushort o = 16; o > 0; o >>= 1) v = nanmax(v, simd_shuffle_xor(v, o));
    if (lane == 0) part[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = part[0];
    for (uint i = 1; i < nsg; ++i) t = nanmax(t, part[i]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return t;
}

inline float group_sum(float v, threadgroup float* part, uint lane, uint sg, uint nsg) {
    v = simd_sum(v);
    if (lane == 0) part[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = 0.0f;
    for (uint i = 0; i < nsg; ++i) t += part[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return t;
}

// mask_kind: 0 none, 1 bool (M = uchar), 2 additive (M = T); element [b, h, 0, j] at b * msb + h * msh + j.
// scratch: L floats per (batch, query head).
template <typename T, typename M>
kernel void attn_decode(device const T* q [[buffer(0)]], device const T* k [[buffer(1)]],
                        device const T* v [[buffer(2)]], device const M* mask [[buffer(3)]],
                        device float* scratch [[buffer(4)]], device T* out [[buffer(5)]],
                        constant uint& Hq [[buffer(6)]], constant uint& Hkv [[buffer(7)]],
                        constant uint& L [[buffer(8)]], constant uint& D [[buffer(9)]],
                        constant float& scale [[buffer(10)]], constant uint& msb [[buffer(11)]],
                        constant uint& msh [[buffer(12)]], constant uint& mask_kind [[buffer(13)]],
                        uint bh [[threadgroup_position_in_grid]], uint tid [[thread_position_in_threadgroup]],
                        uint tpg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
    threadgroup float part[32];
    const uint b = bh / Hq, h = bh % Hq, G = Hq / Hkv, g = h / G;
    device const T* qr = q + (ulong)bh * D;
    device const T* kb = k + ((ulong)b * Hkv + g) * L * D;
    device const T* vb = v + ((ulong)b * Hkv + g) * L * D;
    device float* sr = scratch + (ulong)bh * L;
    const ulong mo = (ulong)b * msb + (ulong)h * msh;
    float m = -INFINITY;
    for (uint j = tid; j < L; j += tpg) {
        float dot = 0.0f;
        for (uint d = 0; d < D; ++d) dot += (float(qr[d]) * scale) * float(kb[(ulong)j * D + d]);
        if (mask_kind == 1) dot += float(mask[mo + j]) != 0.0f ? 0.0f : -INFINITY;
        else if (mask_kind == 2) dot += float(mask[mo + j]);
        sr[j] = dot;
        m = nanmax(m, dot);
    }
    m = group_max(m, part, lane, sg, nsg);
    float sum = 0.0f;
    for (uint j = tid; j < L; j += tpg) {
        const float p = m == -INFINITY ? 0.0f : exp(sr[j] - m);
        sr[j] = p;
        sum += p;
    }
    sum = group_sum(sum, part, lane, sg, nsg);
    threadgroup_barrier(mem_flags::mem_device);  // every thread's weights, written to the scratch row, seen by all
    for (uint d = tid; d < D; d += tpg) {
        float a = 0.0f;
        for (uint j = 0; j < L; ++j) a += sr[j] * float(vb[(ulong)j * D + d]);
        out[(ulong)bh * D + d] = T(m == -INFINITY ? 0.0f : a / sum);
    }
}

#define ATTN(NAME, T, M) \
    template [[host_name(NAME)]] [[kernel]] decltype(attn_decode<T, M>) attn_decode<T, M>;
ATTN("attn_decode_f32", float, float)
ATTN("attn_decode_f32_bool", float, uchar)
ATTN("attn_decode_f16", half, half)
ATTN("attn_decode_f16_bool", half, uchar)
ATTN("attn_decode_bf16", bfloat, bfloat)
ATTN("attn_decode_bf16_bool", bfloat, uchar)
"""


def attention_decode(query, key, value, attention_mask, scaling, groups):
    B, Hq, S1, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    m = attention_mask
    served = (S1 == 1 and query.dtype in (torch.float32, torch.float16, torch.bfloat16) and key.dtype == query.dtype
              and value.dtype == query.dtype and key.dim() == 4 and tuple(key.shape) == (B, Hkv, L, D)
              and tuple(value.shape) == (B, Hkv, L, D) and Hkv * groups == Hq and L > 0 and D > 0
              and (m is None or (m.dim() == 4 and m.shape[0] in (1, B) and m.shape[1] in (1, Hq)
                                 and m.shape[2] == 1 and m.shape[3] == L
                                 and (m.dtype == torch.bool or m.dtype == query.dtype))))
    if not served:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=m, scale=scaling, enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous()
    q = query.contiguous()
    k = key.contiguous()
    v = value.contiguous()
    out = torch.empty((B, 1, Hq, D), dtype=query.dtype, device=query.device)
    scratch = torch.empty((B * Hq * L,), dtype=torch.float32, device=query.device)
    kind, msb, msh = 0, 0, 0
    mask = q
    if m is not None:
        mask = m.contiguous()
        msh = L if m.shape[1] == Hq and Hq > 1 else 0
        msb = m.shape[1] * L if m.shape[0] == B and B > 1 else 0
        kind = 1 if m.dtype == torch.bool else 2
    scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(D)
    tg = 256 if L >= 256 or D > 128 else 128
    n = B * Hq * tg
    if query.dtype == torch.float32 and kind == 1:
        lib.attn_decode_f32_bool(q, k, v, mask, scratch, out, Hq, Hkv, L, D, scale, msb, msh, kind, threads=n,
                                 group_size=tg)
    elif query.dtype == torch.float32:
        lib.attn_decode_f32(q, k, v, mask, scratch, out, Hq, Hkv, L, D, scale, msb, msh, kind, threads=n,
                            group_size=tg)
    elif query.dtype == torch.float16 and kind == 1:
        lib.attn_decode_f16_bool(q, k, v, mask, scratch, out, Hq, Hkv, L, D, scale, msb, msh, kind, threads=n,
                                 group_size=tg)
    elif query.dtype == torch.float16:
        lib.attn_decode_f16(q, k, v, mask, scratch, out, Hq, Hkv, L, D, scale, msb, msh, kind, threads=n,
                            group_size=tg)
    elif kind == 1:
        lib.attn_decode_bf16_bool(q, k, v, mask, scratch, out, Hq, Hkv, L, D, scale, msb, msh, kind, threads=n,
                                  group_size=tg)
    else:
        lib.attn_decode_bf16(q, k, v, mask, scratch, out, Hq, Hkv, L, D, scale, msb, msh, kind, threads=n,
                             group_size=tg)
    return out
