SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// The core of causal self-attention with rotary embeddings, after the q/k/v projections (eager
// matmuls): rope(q), rope(k), scores * scale, causal softmax, @ v, written straight into the
// (B, T, H * hd) layout o_proj reads (eager: about 20 kernels and 6 intermediates).
// One SIMD-group per query row (b, h, i). Scores: lane j takes key j (j <= i), summing over the head
// dimension in order with one fma per term, and the rotary products rounded as eager rounds them:
// a peaked softmax (large inputs) amplifies last-bit score differences, and this is the order of
// the matmul kernels eager uses at these sizes. Softmax: max, exp(s - max), sum, divide. Then p @ v
// with lane d summing over every key in order, masked ones with weight 0 as in eager (where 0 * v
// still turns a NaN or Inf in v into NaN).
#define MAX_T 1024
#define MAX_HD 128

inline float rope(device const float* p, ulong base, uint d, uint half_d, float c, float s) {
    const float rot = d < half_d ? -p[base + d + half_d] : p[base + d - half_d];
    return p[base + d] * c + rot * s;
}

kernel void attn_rope_causal(device const float* q [[buffer(0)]], device const float* k [[buffer(1)]],
                             device const float* v [[buffer(2)]], device const float* cs [[buffer(3)]],
                             device const float* sn [[buffer(4)]], device float* y [[buffer(5)]],
                             constant uint& T [[buffer(6)]], constant uint& H [[buffer(7)]],
                             constant uint& HD [[buffer(8)]], constant float& scale [[buffer(9)]],
                             uint2 tg [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float qs[MAX_HD];
    threadgroup float att[MAX_T];
    const uint row = tg.y;
    const uint i = row % T, h = (row / T) % H, b = row / (T * H);
    const uint C = H * HD, half_d = HD / 2;
    const ulong qbase = ((ulong)b * T + i) * C + h * HD;
    for (uint d = lane; d < HD; d += 32) qs[d] = rope(q, qbase, d, half_d, cs[i * HD + d], sn[i * HD + d]);
    threadgroup_barrier(mem_flags::mem_threadgroup);

    float m = -INFINITY;
    for (uint j = lane; j <= i; j += 32) {
        const ulong kbase = ((ulong)b * T + j) * C + h * HD;
        float s = 0.0f;
        for (uint d = 0; d < HD; ++d) s = fma(qs[d], rope(k, kbase, d, half_d, cs[j * HD + d], sn[j * HD + d]), s);
        s *= scale;
        att[j] = s;
        m = max(m, s);
    }
    m = simd_max(m);
    float l = 0.0f;
    for (uint j = lane; j <= i; j += 32) {
        const float p = exp(att[j] - m);
        att[j] = p;
        l += p;
    }
    l = simd_sum(l);
    for (uint j = lane; j < T; j += 32) att[j] = j <= i ? att[j] / l : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);

    for (uint d = lane; d < HD; d += 32) {
        float acc = 0.0f;
        for (uint j = 0; j < T; ++j) acc = fma(att[j], v[((ulong)b * T + j) * C + h * HD + d], acc);
        y[qbase + d] = acc;
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    B, T, C = x.shape
    H = module.n_heads
    hd = module.head_dim
    assert hd % 2 == 0 and hd <= 128 and T <= 1024 and T <= module.cos.shape[0]
    q = F.linear(x, module.q_proj.weight).contiguous()
    k = F.linear(x, module.k_proj.weight).contiguous()
    v = F.linear(x, module.v_proj.weight).contiguous()
    y = torch.empty_like(q)
    lib.attn_rope_causal(q, k, v, module.cos, module.sin, y, T, H, hd, float(module.scale),
                         threads=(32, B * H * T), group_size=(32, 1))
    return F.linear(y, module.o_proj.weight)
