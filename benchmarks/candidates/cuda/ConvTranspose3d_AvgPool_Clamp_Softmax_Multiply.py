"""ConvTranspose3d_AvgPool_Clamp_Softmax_Multiply: the input's avg_pool3d in a kernel (F.avg_pool3d is not
on the sandbox's list; same order of summation and division as ATen's), conv_transpose3d through cuDNN
(as eager); then two passes replace clamp, the spatial softmax and the scale: `stats` reads the conv
output once and writes per-chunk (max, sum of exp(x - max)) of the clamped values (online, merged in a
fixed order), `apply` merges a row's chunks and writes exp(x - max) / sum * scale[c]. 2 reads + 1 write
of the conv output, where eager makes clamp (read+write), softmax (2-3 reads + write) and scale
(read+write). The conv now runs channels-last (cuDNN's NDHWC kernels were 1.21x faster than the NCDHW
ones: docs/cuda/h100_conv_layout_run1.txt): the pooling kernel writes its output NDHWC, and
stats_ndhwc / stats_merge / apply_ndhwc read the NDHWC conv output (32-channel tiles, float4), apply
writing the NCDHW result through a shared-memory transpose. The NCDHW kernels remain as the fallback."""
SOURCE = r"""
#include <cmath>
// x: P planes of D x H x W -> P planes of Do x Ho x Wo (window k, stride s, no padding, count_include_pad)
extern "C" __global__ void __launch_bounds__(256) avg_pool3d_k(const float* __restrict__ x, float* __restrict__ out,
        long long P, int D, int H, int W, int Do, int Ho, int Wo, int k, int s) {
    const float div = (float)(k * k * k);
    const long long total = P * Do * Ho * Wo;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int ow = (int)(i % Wo);
        long long t = i / Wo;
        const int oh = (int)(t % Ho);
        t /= Ho;
        const int od = (int)(t % Do);
        const long long p = t / Do;
        const float* src = x + p * D * H * W;
        float sum = 0.0f;
        for (int a = 0; a < k; ++a)
            for (int b = 0; b < k; ++b)
                for (int e = 0; e < k; ++e)
                    sum += src[((long long)(od * s + a) * H + (oh * s + b)) * W + (ow * s + e)];
        out[i] = sum / div;
    }
}

// x: N x Ci x D x H x W -> out channels-last: N x Do x Ho x Wo x Ci (window k, stride s, no padding).
// Block (32, 8): 32 outputs along w x 32 channels of one (n, od, oh); grid: one block per such tile.
// Warp ty sums channels ty, ty + 8, ty + 16, ty + 24 for 32 neighbouring ow (reads along w, the same
// order of summation and division as avg_pool3d_k); the tile goes through shared memory and is stored
// with the channels contiguous.
extern "C" __global__ void __launch_bounds__(256) avg_pool3d_cl(const float* __restrict__ x, float* __restrict__ out,
        int Ci, int D, int H, int W, int Do, int Ho, int Wo, int k, int s) {
    __shared__ float tile[32][33];
    const float div = (float)(k * k * k);
    const int WT = (Wo + 31) >> 5, CT = (Ci + 31) >> 5;
    long long r = blockIdx.x;
    const int wt = (int)(r % WT);
    r /= WT;
    const int ct = (int)(r % CT);
    r /= CT;
    const int oh = (int)(r % Ho);
    r /= Ho;
    const int od = (int)(r % Do);
    const long long n = r / Do;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int ow = wt * 32 + tx;
    for (int j = 0; j < 4; ++j) {
        const int cl = ty + 8 * j, c = ct * 32 + cl;
        if (ow < Wo && c < Ci) {
            const float* src = x + (n * Ci + c) * D * H * W;
            float sum = 0.0f;
            for (int a = 0; a < k; ++a)
                for (int b = 0; b < k; ++b)
                    for (int e = 0; e < k; ++e)
                        sum += src[((long long)(od * s + a) * H + (oh * s + b)) * W + (ow * s + e)];
            tile[cl][tx] = sum / div;
        }
    }
    __syncthreads();
    const int c = ct * 32 + tx;
    if (c < Ci) {
        float* dst = out + ((n * Do + od) * Ho + oh) * (long long)Wo * Ci + c;
        for (int j = 0; j < 4; ++j) {
            const int o = ty + 8 * j, w = wt * 32 + o;
            if (w < Wo) dst[(long long)w * Ci] = tile[tx][o];
        }
    }
}

__device__ __forceinline__ float clampn(float v, float lo, float hi) { return (v != v) ? v : fminf(fmaxf(v, lo), hi); }

// online (max, sum exp(x - max)); NaN in x makes the sum NaN (as torch's softmax turns the row NaN)
__device__ __forceinline__ void online(float& m, float& s, float v) {
    if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }
    else s += expf(v - m);
}
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    if (s2 == 0.0f) return;                      // empty part
    if (s == 0.0f) { m = m2; s = s2; return; }
    const float M = fmaxf(m, m2);
    s = s * expf(m - M) + s2 * expf(m2 - M);
    m = M;
}

// y: R rows of L (row = n * C + c); grid (chunks, R); part[(r * chunks + k) * 2 + {0, 1}] = (max, sum)
extern "C" __global__ void __launch_bounds__(256) stats(const float* __restrict__ y, float* __restrict__ part,
        int R, int L, int chunk, float lo, float hi) {
    __shared__ float shm[8], shs[8];
    for (int r = blockIdx.y; r < R; r += gridDim.y) {
        const long long base = (long long)r * L;
        const int start = blockIdx.x * chunk, stop = min(start + chunk, L);
        float m = -INFINITY, s = 0.0f;
        if ((L & 3) == 0) {
            const float4* v4 = reinterpret_cast<const float4*>(y + base);
            for (int j = (start >> 2) + threadIdx.x; j < (stop >> 2); j += blockDim.x) {
                const float4 v = v4[j];
                online(m, s, clampn(v.x, lo, hi)); online(m, s, clampn(v.y, lo, hi));
                online(m, s, clampn(v.z, lo, hi)); online(m, s, clampn(v.w, lo, hi));
            }
        } else {
            for (int j = start + threadIdx.x; j < stop; j += blockDim.x) online(m, s, clampn(y[base + j], lo, hi));
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            merge(m, s, m2, s2);
        }
        if ((threadIdx.x & 31) == 0) { shm[threadIdx.x >> 5] = m; shs[threadIdx.x >> 5] = s; }
        __syncthreads();
        if (threadIdx.x == 0) {
            float M = -INFINITY, S = 0.0f;
            for (int w = 0; w < (int)(blockDim.x >> 5); ++w) merge(M, S, shm[w], shs[w]);
            part[((long long)r * gridDim.x + blockIdx.x) * 2] = M;
            part[((long long)r * gridDim.x + blockIdx.x) * 2 + 1] = S;
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(256) apply(const float* __restrict__ y, const float* __restrict__ part,
        const float* __restrict__ scale, float* __restrict__ out, int R, int C, int L, int chunk, float lo, float hi) {
    for (int r = blockIdx.y; r < R; r += gridDim.y) {
        float M = -INFINITY, S = 0.0f;
        for (int k = 0; k < (int)gridDim.x; ++k)
            merge(M, S, part[((long long)r * gridDim.x + k) * 2], part[((long long)r * gridDim.x + k) * 2 + 1]);
        const float sc = scale[r % C];
        const long long base = (long long)r * L;
        const int start = blockIdx.x * chunk, stop = min(start + chunk, L);
        if ((L & 3) == 0) {
            const float4* v4 = reinterpret_cast<const float4*>(y + base);
            float4* o4 = reinterpret_cast<float4*>(out + base);
            for (int j = (start >> 2) + threadIdx.x; j < (stop >> 2); j += blockDim.x) {
                float4 v = v4[j];
                v.x = expf(clampn(v.x, lo, hi) - M) / S * sc;
                v.y = expf(clampn(v.y, lo, hi) - M) / S * sc;
                v.z = expf(clampn(v.z, lo, hi) - M) / S * sc;
                v.w = expf(clampn(v.w, lo, hi) - M) / S * sc;
                o4[j] = v;
            }
        } else {
            for (int j = start + threadIdx.x; j < stop; j += blockDim.x)
                out[base + j] = expf(clampn(y[base + j], lo, hi) - M) / S * sc;
        }
    }
}
// y channels-last: N x L x C4 float4 (L = D * H * W, C = 4 * C4). Block of 256 threads on sample
// n = blockIdx.z, the 32-channel tile blockIdx.y and positions [k * chunk, (k + 1) * chunk), k = blockIdx.x:
// thread t reads float4 q = t & 7 of the tile at positions t >> 3, + 32, ... (a warp reads 4 whole
// 128-byte channel rows) and keeps (max, sum) of its 4 clamped channels online; lanes of a channel are
// merged by shuffles (xor 8, 16), then the 8 warps in order. part[((n * C + c) * chunks + k) * 2 + {0, 1}]
extern "C" __global__ void __launch_bounds__(256) stats_ndhwc(const float4* __restrict__ y, float* __restrict__ part,
        int C4, int L, int chunk, float lo, float hi) {
    __shared__ float shm[8][32], shs[8][32];
    const int t = threadIdx.x, lane = t & 31, w = t >> 5, q = t & 7;
    const int k = blockIdx.x, cq = blockIdx.y * 8 + q;
    const long long n = blockIdx.z;
    const int start = k * chunk, stop = min(start + chunk, L);
    float m0 = -INFINITY, m1 = -INFINITY, m2 = -INFINITY, m3 = -INFINITY;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    if (cq < C4) {
        const float4* p = y + n * L * C4 + cq;
#pragma unroll 4
        for (int j = start + (t >> 3); j < stop; j += 32) {
            const float4 v = p[(long long)j * C4];
            online(m0, s0, clampn(v.x, lo, hi)); online(m1, s1, clampn(v.y, lo, hi));
            online(m2, s2, clampn(v.z, lo, hi)); online(m3, s3, clampn(v.w, lo, hi));
        }
    }
    for (int o = 8; o < 32; o <<= 1) {
        float a = __shfl_xor_sync(0xffffffffu, m0, o), b = __shfl_xor_sync(0xffffffffu, s0, o);
        merge(m0, s0, a, b);
        a = __shfl_xor_sync(0xffffffffu, m1, o); b = __shfl_xor_sync(0xffffffffu, s1, o);
        merge(m1, s1, a, b);
        a = __shfl_xor_sync(0xffffffffu, m2, o); b = __shfl_xor_sync(0xffffffffu, s2, o);
        merge(m2, s2, a, b);
        a = __shfl_xor_sync(0xffffffffu, m3, o); b = __shfl_xor_sync(0xffffffffu, s3, o);
        merge(m3, s3, a, b);
    }
    if (lane < 8) {  // lane == q
        shm[w][4 * q] = m0; shm[w][4 * q + 1] = m1; shm[w][4 * q + 2] = m2; shm[w][4 * q + 3] = m3;
        shs[w][4 * q] = s0; shs[w][4 * q + 1] = s1; shs[w][4 * q + 2] = s2; shs[w][4 * q + 3] = s3;
    }
    __syncthreads();
    const int C = 4 * C4, c = blockIdx.y * 32 + t;
    if (t < 32 && c < C) {
        float M = -INFINITY, S = 0.0f;
        for (int v = 0; v < 8; ++v) merge(M, S, shm[v][t], shs[v][t]);
        part[((n * C + c) * gridDim.x + k) * 2] = M;
        part[((n * C + c) * gridDim.x + k) * 2 + 1] = S;
    }
}

// a warp per row r (= n * C + c): lane l merges chunks l, l + 32, ... in order, then a fixed tree over the
// lanes; ms[r * 2 + {0, 1}] = the row's (max, sum of exp(x - max))
extern "C" __global__ void __launch_bounds__(256) stats_merge(const float* __restrict__ part, float* __restrict__ ms,
        int R, int chunks) {
    const int lane = threadIdx.x & 31;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; r < R; r += nwarps) {
        float M = -INFINITY, S = 0.0f;
        for (int k = lane; k < chunks; k += 32) merge(M, S, part[(r * chunks + k) * 2], part[(r * chunks + k) * 2 + 1]);
        for (int o = 16; o > 0; o >>= 1) {
            const float a = __shfl_down_sync(0xffffffffu, M, o), b = __shfl_down_sync(0xffffffffu, S, o);
            if (lane + o < 32) merge(M, S, a, b);
        }
        if (lane == 0) { ms[r * 2] = M; ms[r * 2 + 1] = S; }
    }
}

// y channels-last as in stats_ndhwc; out: N x C x L. Block of 256 threads on sample n = blockIdx.z, the
// 32-channel tile blockIdx.y, positions [blockIdx.x * tiles * 32, + tiles * 32) in tiles of 32: thread t
// reads float4 t & 7 of position t >> 3 (whole 128-byte rows), writes exp(clamp(x) - max) / sum * scale[c]
// to a shared tile; then warp v stores channels v, v + 8, ... of the tile, 32 neighbouring positions each.
extern "C" __global__ void __launch_bounds__(256) apply_ndhwc(const float4* __restrict__ y, const float* __restrict__ ms,
        const float* __restrict__ scale, float* __restrict__ out, int C4, int L, int tiles, float lo, float hi) {
    __shared__ float tile[32][33];
    __shared__ float sM[32], sS[32], sC[32];
    const int t = threadIdx.x, q = t & 7, pp = t >> 3, pw = t & 31, cw = t >> 5;
    const int C = 4 * C4, c0 = blockIdx.y * 32, cq = blockIdx.y * 8 + q;
    const long long n = blockIdx.z;
    if (t < 32 && c0 + t < C) {
        sM[t] = ms[(n * C + c0 + t) * 2];
        sS[t] = ms[(n * C + c0 + t) * 2 + 1];
        sC[t] = scale[c0 + t];
    }
    __syncthreads();
    const float4* yn = y + n * L * C4 + cq;
    float* on = out + (n * C + c0) * L;
    for (int tt = 0; tt < tiles; ++tt) {
        const int p0 = (blockIdx.x * tiles + tt) * 32;
        if (p0 >= L) break;  // uniform over the block
        if (p0 + pp < L && cq < C4) {
            const float4 v = yn[(long long)(p0 + pp) * C4];
            const int c = 4 * q;
            tile[c][pp] = expf(clampn(v.x, lo, hi) - sM[c]) / sS[c] * sC[c];
            tile[c + 1][pp] = expf(clampn(v.y, lo, hi) - sM[c + 1]) / sS[c + 1] * sC[c + 1];
            tile[c + 2][pp] = expf(clampn(v.z, lo, hi) - sM[c + 2]) / sS[c + 2] * sC[c + 2];
            tile[c + 3][pp] = expf(clampn(v.w, lo, hi) - sM[c + 3]) / sS[c + 3] * sC[c + 3];
        }
        __syncthreads();
        if (p0 + pw < L) {
            for (int j = 0; j < 4; ++j) {
                const int c = cw + 8 * j;
                if (c0 + c < C) on[(long long)c * L + p0 + pw] = tile[c][pw];
            }
        }
        __syncthreads();
    }
}
"""
SHAPE_GENERIC = True
CHUNK = 8192
CL_CHUNK = 512     # positions per stats_ndhwc block
APPLY_TILES = 4    # 32-position tiles per apply_ndhwc block


def forward(module, x):
    k = module.avg_pool.kernel_size
    s = module.avg_pool.stride
    assert module.avg_pool.padding == 0 and not module.avg_pool.ceil_mode
    assert module.avg_pool.divisor_override is None
    xc = x.contiguous()
    N, Ci, D, H, W = xc.shape
    Do, Ho, Wo = (D - k) // s + 1, (H - k) // s + 1, (W - k) // s + 1
    lo = float(module.clamp_min)
    hi = float(module.clamp_max)
    if module.conv_transpose.out_channels % 4 == 0:
        fmt = torch.channels_last_3d
        xp = torch.empty((N, Do, Ho, Wo, Ci), dtype=xc.dtype, device=xc.device)  # NDHWC
        tiles = N * Do * Ho * ((Wo + 31) // 32) * ((Ci + 31) // 32)
        lib.avg_pool3d_cl(xc, xp, Ci, D, H, W, Do, Ho, Wo, k, s, grid=(max(1, tiles),), block=(32, 8))
        y = F.conv_transpose3d(xp.permute(0, 4, 1, 2, 3), module.conv_transpose.weight.contiguous(memory_format=fmt),
                               module.conv_transpose.bias, module.conv_transpose.stride,
                               module.conv_transpose.padding, module.conv_transpose.output_padding,
                               module.conv_transpose.groups, module.conv_transpose.dilation)
        N, C, Dy, Hy, Wy = y.shape
        assert module.scale.numel() == C
        L = Dy * Hy * Wy
        if C % 4 == 0 and 0 < N <= 65535 and L > 0 and y.is_contiguous(memory_format=fmt):
            yl = y.permute(0, 2, 3, 4, 1)  # contiguous N x D x H x W x C
            ctiles = (C + 31) // 32
            chunks = (L + CL_CHUNK - 1) // CL_CHUNK
            part = torch.empty(N * C * chunks * 2, dtype=torch.float32, device=y.device)
            lib.stats_ndhwc(yl, part, C // 4, L, CL_CHUNK, lo, hi, grid=(chunks, ctiles, N), block=(256,))
            ms = torch.empty(N * C * 2, dtype=torch.float32, device=y.device)
            lib.stats_merge(part, ms, N * C, chunks, grid=(min((N * C + 7) // 8, 132 * 16),), block=(256,))
            out = torch.empty((N, C, Dy, Hy, Wy), dtype=y.dtype, device=y.device)
            lib.apply_ndhwc(yl, ms, module.scale.contiguous(), out, C // 4, L, APPLY_TILES, lo, hi,
                            grid=((L + 32 * APPLY_TILES - 1) // (32 * APPLY_TILES), ctiles, N), block=(256,))
            return out
        y = y.contiguous()
    else:
        xp = torch.empty((N, Ci, Do, Ho, Wo), dtype=xc.dtype, device=xc.device)
        total = N * Ci * Do * Ho * Wo
        lib.avg_pool3d_k(xc, xp, N * Ci, D, H, W, Do, Ho, Wo, k, s,
                         grid=(max(1, min((total + 255) // 256, 132 * 16)),), block=(256,))
        y = F.conv_transpose3d(xp, module.conv_transpose.weight, module.conv_transpose.bias,
                               module.conv_transpose.stride, module.conv_transpose.padding,
                               module.conv_transpose.output_padding, module.conv_transpose.groups,
                               module.conv_transpose.dilation)
    C = y.shape[1]
    assert module.scale.numel() == C
    R = y.shape[0] * C
    L = y.numel() // max(R, 1)
    chunks = (L + CHUNK - 1) // CHUNK
    part = torch.empty(R * chunks * 2, dtype=torch.float32, device=y.device)
    grid = (chunks, min(R, 65535))
    lib.stats(y, part, R, L, CHUNK, lo, hi, grid=grid, block=(256,))
    out = torch.empty_like(y)
    lib.apply(y, part, module.scale.contiguous(), out, R, C, L, CHUNK, lo, hi, grid=grid, block=(256,))
    return out
