"""ConvTranspose2d_GlobalAvgPool_BiasAdd_LogSumExp_Sum_Multiply: conv_transpose2d through cuDNN (as eager);
then one read of the conv output gives per-plane sums (double, per chunk, combined in a fixed order),
and one tiny kernel does mean + bias, logsumexp over channels (torch's formula: NaN-propagating max,
an infinite max replaced by 0), the sum over a 1x1 plane (identity) and * 10. Eager launches about ten
kernels after the mean (amax, masked_fill, sub, exp, sum, log, add, sum, mul)."""
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
"""
SHAPE_GENERIC = True
CHUNK = 16384


def forward(module, x):
    y = F.conv_transpose2d(x, module.conv_transpose.weight, module.conv_transpose.bias, module.conv_transpose.stride,
                           module.conv_transpose.padding, module.conv_transpose.output_padding,
                           module.conv_transpose.groups, module.conv_transpose.dilation)
    N, C, H, W = y.shape
    assert module.bias.numel() == C
    P = N * C
    L = H * W
    chunks = (L + CHUNK - 1) // CHUNK
    part = torch.empty(P * chunks, dtype=torch.float64, device=y.device)
    lib.plane_partial(y, part, P, L, CHUNK, grid=(chunks, min(P, 65535)), block=(256,))
    out = torch.empty((N, 1), dtype=y.dtype, device=y.device)
    lib.finish_lse(part, module.bias.contiguous(), out, N, C, chunks, L, 10.0, grid=((N + 127) // 128,), block=(128,))
    return out
