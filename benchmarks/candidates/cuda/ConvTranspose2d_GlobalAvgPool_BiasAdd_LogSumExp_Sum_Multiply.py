"""ConvTranspose2d_GlobalAvgPool_BiasAdd_LogSumExp_Sum_Multiply: conv_transpose2d through cuDNN, channels-last
(its NHWC kernels were 1.40x faster than the NCHW ones eager gets: docs/cuda/h100_conv_layout_run1.txt);
then one read of the NHWC conv output gives per-(sample, channel) sums (double, a block per chunk of
positions and 32-channel tile reading whole 128-byte channel rows, combined in a fixed order), and one
tiny kernel does mean + bias, logsumexp over channels (torch's formula: NaN-propagating max, an infinite
max replaced by 0), the sum over a 1x1 plane (identity) and * 10. Eager launches about ten kernels after
the mean (amax, masked_fill, sub, exp, sum, log, add, sum, mul). The NCHW kernels remain as the fallback."""
SOURCE = r"""
#include <cmath>
__device__ __forceinline__ double block_sum_d(double v, double* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) t += sh[i];
    return t;
}

// y: P planes of L; grid (chunks, P); part[p * chunks + k] = sum over chunk k
extern "C" __global__ void __launch_bounds__(256) plane_partial(const float* __restrict__ y, double* __restrict__ part,
        int P, int L, int chunk) {
    __shared__ double sh[32];
    for (int p = blockIdx.y; p < P; p += gridDim.y) {
        const long long base = (long long)p * L;
        const int start = blockIdx.x * chunk, stop = min(start + chunk, L);
        double s = 0.0;
        if ((L & 3) == 0) {
            const float4* v4 = reinterpret_cast<const float4*>(y + base);
            for (int j = (start >> 2) + threadIdx.x; j < (stop >> 2); j += blockDim.x) {
                const float4 v = v4[j];
                s += (double)v.x; s += (double)v.y; s += (double)v.z; s += (double)v.w;
            }
        } else {
            for (int j = start + threadIdx.x; j < stop; j += blockDim.x) s += (double)y[base + j];
        }
        const double t = block_sum_d(s, sh);
        if (threadIdx.x == 0) part[(long long)p * gridDim.x + blockIdx.x] = t;
        __syncthreads();
    }
}

// one thread per sample: m_c = mean_c + bias_c; out = 10 * logsumexp_c(m_c)
extern "C" __global__ void finish_lse(const double* __restrict__ part, const float* __restrict__ bias,
        float* __restrict__ out, int N, int C, int chunks, int L, float mult) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float mx = -INFINITY;
    for (int c = 0; c < C; ++c) {
        double s = 0.0;
        for (int k = 0; k < chunks; ++k) s += part[((long long)n * C + c) * chunks + k];
        const float v = (float)(s / (double)L) + bias[c];
        if (v > mx || v != v) mx = v;   // amax propagates NaN
    }
    if (fabsf(mx) == INFINITY) mx = 0.0f;
    float se = 0.0f;
    for (int c = 0; c < C; ++c) {
        double s = 0.0;
        for (int k = 0; k < chunks; ++k) s += part[((long long)n * C + c) * chunks + k];
        const float v = (float)(s / (double)L) + bias[c];
        se += expf(v - mx);
    }
    out[n] = (logf(se) + mx) * mult;
}
// y channels-last: N x L x C4 float4 (L = H * W, C = 4 * C4). Block of 256 threads on sample n = blockIdx.z,
// the 32-channel tile blockIdx.y and positions [k * chunk, (k + 1) * chunk), k = blockIdx.x: thread t reads
// float4 t & 7 of the tile at positions t >> 3, + 32, ... (a warp reads 4 whole 128-byte channel rows) and
// sums its 4 channels in double; the lanes of a channel are added by shuffles (xor 8, 16), then the 8 warps
// in order. part[(n * chunks + k) * C + c]
extern "C" __global__ void __launch_bounds__(256) plane_partial_nhwc(const float4* __restrict__ y,
        double* __restrict__ part, int C4, int L, int chunk) {
    __shared__ double sh[8][32];
    const int t = threadIdx.x, lane = t & 31, w = t >> 5, q = t & 7;
    const int k = blockIdx.x, cq = blockIdx.y * 8 + q;
    const long long n = blockIdx.z;
    const int start = k * chunk, stop = min(start + chunk, L);
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    if (cq < C4) {
        const float4* p = y + n * L * C4 + cq;
#pragma unroll 4
        for (int j = start + (t >> 3); j < stop; j += 32) {
            const float4 v = p[(long long)j * C4];
            s0 += (double)v.x; s1 += (double)v.y; s2 += (double)v.z; s3 += (double)v.w;
        }
    }
    for (int o = 8; o < 32; o <<= 1) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, o); s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o); s3 += __shfl_xor_sync(0xffffffffu, s3, o);
    }
    if (lane < 8) { sh[w][4 * q] = s0; sh[w][4 * q + 1] = s1; sh[w][4 * q + 2] = s2; sh[w][4 * q + 3] = s3; }
    __syncthreads();
    const int C = 4 * C4, c = blockIdx.y * 32 + t;
    if (t < 32 && c < C) {
        double tot = 0.0;
        for (int v = 0; v < 8; ++v) tot += sh[v][t];
        part[(n * gridDim.x + k) * C + c] = tot;
    }
}

// a block per sample n (C <= 1024): thread c adds its chunks in order and forms mean + bias; thread 0 then
// does the logsumexp over channels exactly as finish_lse. part as written by plane_partial_nhwc.
extern "C" __global__ void __launch_bounds__(256) finish_lse_nhwc(const double* __restrict__ part,
        const float* __restrict__ bias, float* __restrict__ out, int C, int chunks, int L, float mult) {
    __shared__ float vals[1024];
    const long long n = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        double s = 0.0;
        for (int k = 0; k < chunks; ++k) s += part[(n * chunks + k) * C + c];
        vals[c] = (float)(s / (double)L) + bias[c];
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    float mx = -INFINITY;
    for (int c = 0; c < C; ++c) {
        const float v = vals[c];
        if (v > mx || v != v) mx = v;   // amax propagates NaN
    }
    if (fabsf(mx) == INFINITY) mx = 0.0f;
    float se = 0.0f;
    for (int c = 0; c < C; ++c) se += expf(vals[c] - mx);
    out[n] = (logf(se) + mx) * mult;
}
"""
SHAPE_GENERIC = True
CHUNK = 16384
CL_CHUNK = 1024    # positions per plane_partial_nhwc block


def forward(module, x):
    fmt = torch.channels_last
    w = module.conv_transpose.weight.contiguous(memory_format=fmt)
    y = F.conv_transpose2d(x.contiguous(memory_format=fmt), w, module.conv_transpose.bias,
                           module.conv_transpose.stride, module.conv_transpose.padding,
                           module.conv_transpose.output_padding, module.conv_transpose.groups,
                           module.conv_transpose.dilation)
    N, C, H, W = y.shape
    assert module.bias.numel() == C
    P = N * C
    L = H * W
    out = torch.empty((N, 1), dtype=y.dtype, device=y.device)
    if C % 4 == 0 and C <= 1024 and 0 < N <= 65535 and L > 0 and y.is_contiguous(memory_format=fmt):
        chunks = (L + CL_CHUNK - 1) // CL_CHUNK
        part = torch.empty(N * chunks * C, dtype=torch.float64, device=y.device)
        lib.plane_partial_nhwc(y.permute(0, 2, 3, 1), part, C // 4, L, CL_CHUNK, grid=(chunks, (C + 31) // 32, N),
                               block=(256,))
        lib.finish_lse_nhwc(part, module.bias.contiguous(), out, C, chunks, L, 10.0, grid=(N,), block=(256,))
        return out
    y = y.contiguous()
    chunks = (L + CHUNK - 1) // CHUNK
    part = torch.empty(P * chunks, dtype=torch.float64, device=y.device)
    lib.plane_partial(y, part, P, L, CHUNK, grid=(chunks, min(P, 65535)), block=(256,))
    lib.finish_lse(part, module.bias.contiguous(), out, N, C, chunks, L, 10.0, grid=((N + 127) // 128,), block=(128,))
    return out
