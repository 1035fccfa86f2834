"""attention_decode (HF sdpa_attention_forward for one query token over a KV cache, grouped-query heads):
out[b, 0, h] = softmax(scale * q[b, h] . k[b, h // G]^T + mask[b, h]) @ v[b, h // G], G = Hq / Hkv.

Split-KV ("flash decoding"): one block of 128 threads per (kv-length chunk, kv head, batch), so a single
sequence still fills the GPU; the block does all G query heads that share the kv head, so every key and value
row is read from memory once (eager's GQA path repacks or expands first). Per tile of 128 keys, each thread
scores one key against the G queries (kept in shared memory as float), a warp per head reduces the tile's max
and exponentiates (online softmax in float), and each thread accumulates its (head, column) outputs over the
tile's values, read coalesced. A second kernel combines the chunks' (max, sum, partial output) and rounds once
to the output dtype. Fully masked rows give 0 and NaN scores make the row NaN, as torch's SDPA does.
Served: q_len 1, q/k/v float32, float16 or bfloat16 of one dtype, key/value [B, Hkv, L, D] with D % 8 == 0 and
D <= 256, G <= 16, mask None, bool, or additive of q's dtype shaped [1 or B, 1 or Hq, 1, L]; anything else runs
torch's SDPA (the same computation, unfused).
"""
DTYPES = ("float32", "float16", "bfloat16")
SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define TILE 128   // keys per tile = threads per block
#define MAXG 16    // query heads per kv head
#define MAXD 256   // head size
#define OUTS 32    // (head, column) outputs per thread: MAXG * MAXD / TILE

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// the larger of a and b, NaN when either is NaN (fmaxf would drop it: a NaN score must make the row NaN)
__device__ __forceinline__ float nanmax(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float ninf() { return __int_as_float(0xff800000); }

// eight elements of a row as floats (16 bytes of 2-byte types, 32 of float: two loads)
template <typename T> struct Eight;
template <> struct Eight<float> {
    static __device__ __forceinline__ void load(const float* p, float* o) {
        const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    }
};
template <typename H> struct EightHalf {
    static __device__ __forceinline__ void load(const H* p, float* o) {
        const uint4 u = *reinterpret_cast<const uint4*>(p);
        const H* h = reinterpret_cast<const H*>(&u);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = to_f(h[i]);
    }
};
template <> struct Eight<__half> : EightHalf<__half> {};
template <> struct Eight<__nv_bfloat16> : EightHalf<__nv_bfloat16> {};

// grid (S, Hkv, B): chunk blockIdx.x of `chunk` keys. pacc[(b*Hq + h) * S + s][D], pml[((b*Hq + h) * S + s) * 2 + {0,1}]
// = (max, sum) of the chunk's scores. mask_kind: 0 none, 1 bool (mb), 2 additive (mf); [b, h, 0, j] at
// b * msb + h * msh + j.
template <typename T>
__device__ __forceinline__ void split_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                             const unsigned char* __restrict__ mb, const T* __restrict__ mf,
                                             float* __restrict__ pacc, float* __restrict__ pml, int Hq, int Hkv,
                                             int L, int D, int chunk, float scale, long long msb, long long msh,
                                             int mask_kind) {
    __shared__ __align__(16) float qs[MAXG * MAXD];
    __shared__ float ps[MAXG][TILE];
    __shared__ float mrow[MAXG], alpha[MAXG], lrow[MAXG];
    const int S = gridDim.x, s = blockIdx.x, g = blockIdx.y, b = blockIdx.z, t = threadIdx.x;
    const int G = Hq / Hkv, lane = t & 31, warp = t >> 5;
    const int j0 = s * chunk, j1 = min(L, j0 + chunk);
    const T* kb = k + ((long long)b * Hkv + g) * (long long)L * D;
    const T* vb = v + ((long long)b * Hkv + g) * (long long)L * D;
    for (int i = t; i < G * D; i += TILE) qs[i] = to_f(q[((long long)b * Hq + (long long)g * G) * D + i]) * scale;
    if (t < G) { mrow[t] = ninf(); lrow[t] = 0.0f; }
    float acc[OUTS];
#pragma unroll
    for (int o = 0; o < OUTS; ++o) acc[o] = 0.0f;
    __syncthreads();
    for (int base = j0; base < j1; base += TILE) {
        const int j = base + t;
        float sc[MAXG];
#pragma unroll
        for (int r = 0; r < MAXG; ++r) sc[r] = 0.0f;
        if (j < j1) {
            const T* kj = kb + (long long)j * D;
            for (int d = 0; d < D; d += 8) {
                float kf[8];
                Eight<T>::load(kj + d, kf);
#pragma unroll
                for (int r = 0; r < MAXG; ++r) {
                    if (r < G) {
                        const float4 a = *reinterpret_cast<const float4*>(qs + r * D + d);
                        const float4 c = *reinterpret_cast<const float4*>(qs + r * D + d + 4);
                        sc[r] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3]
                               + c.x * kf[4] + c.y * kf[5] + c.z * kf[6] + c.w * kf[7];
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < MAXG; ++r) {
            if (r < G) {
                float x = ninf();
                if (j < j1) {
                    x = sc[r];
                    const long long mi = b * msb + (long long)(g * G + r) * msh + j;
                    if (mask_kind == 1) x += mb[mi] ? 0.0f : ninf();
                    else if (mask_kind == 2) x += to_f(mf[mi]);
                }
                ps[r][t] = x;
            }
        }
        __syncthreads();
        // a warp per head: the tile's max, the weights, the rescale of what came before, the sum
        for (int r = warp; r < G; r += TILE / 32) {
            float m = ninf();
            for (int i = lane; i < TILE; i += 32) m = nanmax(m, ps[r][i]);
            for (int o = 16; o > 0; o >>= 1) m = nanmax(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float mold = mrow[r], mnew = nanmax(mold, m);
            float sum = 0.0f;
            for (int i = lane; i < TILE; i += 32) {
                const float p = mnew == ninf() ? 0.0f : expf(ps[r][i] - mnew);
                ps[r][i] = p;
                sum += p;
            }
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp();
            if (lane == 0) {
                const float a = mold == ninf() ? 0.0f : expf(mold - mnew);
                alpha[r] = a;
                lrow[r] = lrow[r] * a + sum;
                mrow[r] = mnew;
            }
        }
        __syncthreads();
        const int n = min(TILE, j1 - base);
#pragma unroll
        for (int o = 0; o < OUTS; ++o) {
            const int idx = t + o * TILE;
            if (idx < G * D) {
                const int r = idx / D, d = idx - r * D;
                float a = acc[o] * alpha[r];
                const T* vc = vb + (long long)base * D + d;
                for (int i = 0; i < n; ++i) a += ps[r][i] * to_f(vc[(long long)i * D]);
                acc[o] = a;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int o = 0; o < OUTS; ++o) {
        const int idx = t + o * TILE;
        if (idx < G * D) {
            const int r = idx / D, d = idx - r * D;
            pacc[(((long long)b * Hq + g * G + r) * S + s) * D + d] = acc[o];
        }
    }
    if (t < G) {
        const long long i = (((long long)b * Hq + g * G + t) * S + s) * 2;
        pml[i] = mrow[t];
        pml[i + 1] = lrow[t];
    }
}

// grid (B * Hq), block (D): out[bh][d] = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M); 0 where every score is -inf
template <typename T>
__device__ __forceinline__ void combine_kernel(const float* __restrict__ pacc, const float* __restrict__ pml,
                                               T* __restrict__ out, int S, int D) {
    const long long bh = blockIdx.x;
    const int d = threadIdx.x;
    float M = ninf();
    for (int s = 0; s < S; ++s) M = nanmax(M, pml[(bh * S + s) * 2]);
    float num = 0.0f, den = 0.0f;
    if (M != ninf()) {
        for (int s = 0; s < S; ++s) {
            const float m = pml[(bh * S + s) * 2];
            const float w = m == ninf() ? 0.0f : expf(m - M);
            num += pacc[(bh * S + s) * D + d] * w;
            den += pml[(bh * S + s) * 2 + 1] * w;
        }
    }
    out[bh * D + d] = from_f<T>(M == ninf() ? 0.0f : num / den);
}

// one pair of entry points per dtype, written out: the backend finds kernels by their extern "C" declarations
extern "C" __global__ void __launch_bounds__(TILE) attn_split_f32(const float* q, const float* k, const float* v,
        const unsigned char* mb, const float* mf, float* pacc, float* pml, int Hq, int Hkv, int L, int D, int chunk,
        float scale, long long msb, long long msh, int mask_kind) {
    split_kernel<float>(q, k, v, mb, mf, pacc, pml, Hq, Hkv, L, D, chunk, scale, msb, msh, mask_kind);
}
extern "C" __global__ void attn_combine_f32(const float* pacc, const float* pml, float* out, int S, int D) {
    combine_kernel<float>(pacc, pml, out, S, D);
}
extern "C" __global__ void __launch_bounds__(TILE) attn_split_f16(const __half* q, const __half* k, const __half* v,
        const unsigned char* mb, const __half* mf, float* pacc, float* pml, int Hq, int Hkv, int L, int D, int chunk,
        float scale, long long msb, long long msh, int mask_kind) {
    split_kernel<__half>(q, k, v, mb, mf, pacc, pml, Hq, Hkv, L, D, chunk, scale, msb, msh, mask_kind);
}
extern "C" __global__ void attn_combine_f16(const float* pacc, const float* pml, __half* out, int S, int D) {
    combine_kernel<__half>(pacc, pml, out, S, D);
}
extern "C" __global__ void __launch_bounds__(TILE) attn_split_bf16(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
        const unsigned char* mb, const __nv_bfloat16* mf, float* pacc, float* pml, int Hq, int Hkv, int L, int D, int chunk,
        float scale, long long msb, long long msh, int mask_kind) {
    split_kernel<__nv_bfloat16>(q, k, v, mb, mf, pacc, pml, Hq, Hkv, L, D, chunk, scale, msb, msh, mask_kind);
}
extern "C" __global__ void attn_combine_bf16(const float* pacc, const float* pml, __nv_bfloat16* out, int S, int D) {
    combine_kernel<__nv_bfloat16>(pacc, pml, out, S, D);
}
"""

TILE = 128          # threads per block, keys per tile (TILE in SOURCE)
TARGET_BLOCKS = 264  # about two blocks per SM of an H100: chunks enough that one sequence fills the GPU


def _launch(name, q, k, v, mb, mf, pacc, pml, out, Hq, Hkv, L, D, chunk, S, B, scale, msb, msh, kind):
    if name == "f32":
        lib.attn_split_f32(q, k, v, mb, mf, pacc, pml, Hq, Hkv, L, D, chunk, scale, msb, msh, kind,
                           grid=(S, Hkv, B), block=(TILE,))
        lib.attn_combine_f32(pacc, pml, out, S, D, grid=(B * Hq,), block=(D,))
    elif name == "f16":
        lib.attn_split_f16(q, k, v, mb, mf, pacc, pml, Hq, Hkv, L, D, chunk, scale, msb, msh, kind,
                           grid=(S, Hkv, B), block=(TILE,))
        lib.attn_combine_f16(pacc, pml, out, S, D, grid=(B * Hq,), block=(D,))
    else:
        lib.attn_split_bf16(q, k, v, mb, mf, pacc, pml, Hq, Hkv, L, D, chunk, scale, msb, msh, kind,
                            grid=(S, Hkv, B), block=(TILE,))
        lib.attn_combine_bf16(pacc, pml, out, S, D, grid=(B * Hq,), block=(D,))


def attention_decode(query, key, value, attention_mask, scaling, groups):
    B, Hq, S1, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    m = attention_mask
    served = (S1 == 1 and query.dtype in (torch.float32, torch.float16, torch.bfloat16) and key.dtype == query.dtype
              and value.dtype == query.dtype and key.dim() == 4 and tuple(key.shape) == (B, Hkv, L, D)
              and tuple(value.shape) == (B, Hkv, L, D) and Hkv * groups == Hq and groups <= 16 and L > 0
              and D % 8 == 0 and 0 < D <= 256
              and (m is None or (m.dim() == 4 and m.shape[0] in (1, B) and m.shape[1] in (1, Hq)
                                 and m.shape[2] == 1 and m.shape[3] == L
                                 and (m.dtype == torch.bool or m.dtype == query.dtype))))
    q = query.contiguous()
    k = key.contiguous()
    v = value.contiguous()
    aligned = q.storage_offset() % 8 == 0 and k.storage_offset() % 8 == 0 and v.storage_offset() % 8 == 0
    if not served or not aligned:  # 16-byte row loads need rows that start 16-byte aligned
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=m, scale=scaling, enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous()
    per = max(1, TARGET_BLOCKS // (B * Hkv))
    chunk = max(TILE, (L + per - 1) // per)
    chunk = (chunk + TILE - 1) // TILE * TILE
    S = (L + chunk - 1) // chunk
    out = torch.empty((B, 1, Hq, D), dtype=query.dtype, device=query.device)
    pacc = torch.empty((B * Hq * S * D,), dtype=torch.float32, device=query.device)
    pml = torch.empty((B * Hq * S * 2,), dtype=torch.float32, device=query.device)
    kind, msb, msh = 0, 0, 0
    mb, mf = None, q  # placeholders for the mask the call does not have: the kernel never reads them
    if m is not None:
        m = m.contiguous()
        msh = L if m.shape[1] == Hq and Hq > 1 else 0
        msb = m.shape[1] * L if m.shape[0] == B and B > 1 else 0
        if m.dtype == torch.bool:
            kind, mb = 1, m
        else:
            kind, mf = 2, m
    if mb is None:
        mb = torch.empty((1,), dtype=torch.bool, device=query.device)
    scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(D)
    name = "f32" if query.dtype == torch.float32 else "f16" if query.dtype == torch.float16 else "bf16"
    _launch(name, q, k, v, mb, mf, pacc, pml, out, Hq, Hkv, L, D, chunk, S, B, scale, msb, msh, kind)
    return out
