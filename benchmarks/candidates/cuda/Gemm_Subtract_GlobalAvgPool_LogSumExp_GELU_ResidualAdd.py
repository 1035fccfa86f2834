"""Gemm_Subtract_GlobalAvgPool_LogSumExp_GELU_ResidualAdd, algebraically: the mean over features of
x . W_h + b_h - s_h is (x . colsum(W) + sum(b - s)) / H, and logsumexp over the resulting size-1
dimension is the identity (also for +-Inf and NaN); so the GEMM becomes one read of W and a
matrix-vector product, then gelu(m_b) + x is written once. Rows holding NaN, Inf or huge values are
recomputed exactly as the GEMM would, so special values behave as in eager."""
SOURCE = r"""
// Sum over the output features of a linear layer without the GEMM:
//   sum_h (x . W_h + beta_h) = x . colsum(W) + sum(beta)
// colsum: partial column sums of W (double) in `chunks` row chunks; rowdot: one block per row of x.
// A row with a non-finite or huge (> 1e28) element takes the exact path instead (`exact`): every
// y_h = x . W_h in float as the GEMM computes it, so NaN/Inf/overflow come out as in eager.
extern "C" __global__ void __launch_bounds__(256) colsum(const float* __restrict__ W, double* __restrict__ part,
                                                        int H, int K, int rows_per_chunk) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= K) return;
    const int h0 = blockIdx.y * rows_per_chunk, h1 = min(h0 + rows_per_chunk, H);
    double s = 0.0;
    for (int h = h0; h < h1; ++h) s += W[(long long)h * K + k];
    part[(long long)blockIdx.y * K + k] = s;
}

__device__ __forceinline__ double block_sum_d(double v, double* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) t += sh[i];
    return t;
}

// dots[b] = x_b . colsum(W) + betasum (double); bad[b] = 1 if the row needs the exact path
extern "C" __global__ void __launch_bounds__(256) rowdot(const float* __restrict__ x, const double* __restrict__ part,
        const float* __restrict__ beta, double* __restrict__ dots, int* __restrict__ bad, int K, int H, int chunks,
        int has_beta) {
    __shared__ double sh[8];
    const long long b = blockIdx.x;
    double s = 0.0;
    int flag = 0;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        const float v = x[b * K + k];
        if (!(fabsf(v) <= 1e28f)) flag = 1;
        double c = 0.0;
        for (int j = 0; j < chunks; ++j) c += part[(long long)j * K + k];
        s += (double)v * c;
    }
    double bs = 0.0;
    if (has_beta) for (int h = threadIdx.x; h < H; h += blockDim.x) bs += beta[h];
    flag = __syncthreads_or(flag);
    const double tot = block_sum_d(s, sh) + block_sum_d(bs, sh);
    if (threadIdx.x == 0) { dots[b] = tot; bad[b] = flag; }
}

// exact path for flagged rows: ysum[b] = sum_h pre * (x_b . W_h + beta_h) in float; one block per row, warp per h
extern "C" __global__ void __launch_bounds__(256) exact(const float* __restrict__ x, const float* __restrict__ W,
        const float* __restrict__ beta, const int* __restrict__ bad, float* __restrict__ ysum, int K, int H,
        int has_beta, float pre) {
    __shared__ float sh[8];
    const long long b = blockIdx.x;
    if (!bad[b]) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    float acc = 0.0f;
    for (int h = warp; h < H; h += nw) {
        float d = 0.0f;
        for (int k = lane; k < K; k += 32) d += x[b * K + k] * W[(long long)h * K + k];
        for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if (has_beta) d += beta[h];
        acc += d * pre;
    }
    if (lane == 0) sh[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) { float t = 0.0f; for (int i = 0; i < nw; ++i) t += sh[i]; ysum[b] = t; }
}

__device__ __forceinline__ float ma_gelu(float x) { return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f)); }
// out[b, k] = gelu(m_b) + x[b, k], m_b = (bad ? ysum : dots) / H
extern "C" __global__ void __launch_bounds__(256) finish_residual(const float* __restrict__ x, const double* __restrict__ dots,
        const int* __restrict__ bad, const float* __restrict__ ysum, float* __restrict__ out, int B, int K, int H) {
    for (int b = blockIdx.y; b < B; b += gridDim.y) {
        const float m = (bad[b] ? ysum[b] : (float)dots[b]) / (float)H;
        const float g = ma_gelu(m);
        for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < K; k += gridDim.x * blockDim.x)
            out[(long long)b * K + k] = g + x[(long long)b * K + k];
    }
}
"""
SHAPE_GENERIC = True

def _rowsums(x, W, beta, has_beta, pre):
    B, K = x.shape[0], x.shape[1]
    H = W.shape[0]
    chunks = min(32, H)
    rpc = (H + chunks - 1) // chunks
    part = torch.empty(chunks * K, dtype=torch.float64, device=x.device)
    lib.colsum(W, part, H, K, rpc, grid=((K + 255) // 256, chunks), block=(256,))
    dots = torch.empty(B, dtype=torch.float64, device=x.device)
    bad = torch.empty(B, dtype=torch.int32, device=x.device)
    lib.rowdot(x, part, beta, dots, bad, K, H, chunks, has_beta, grid=(B,), block=(256,))
    ysum = torch.empty(B, dtype=torch.float32, device=x.device)
    lib.exact(x, W, beta, bad, ysum, K, H, has_beta, pre, grid=(B,), block=(256,))
    return dots, bad, ysum


def forward(module, x):
    xc = x.contiguous()
    B, K = xc.shape[0], xc.shape[1]
    H = module.gemm.weight.shape[0]
    beta = (module.gemm.bias - module.subtract).contiguous()
    dots, bad, ysum = _rowsums(xc, module.gemm.weight, beta, 1, 1.0)
    out = torch.empty_like(xc)
    lib.finish_residual(xc, dots, bad, ysum, out, B, K, H, grid=(min((K + 255) // 256, 32), min(B, 65535)), block=(256,))
    return out
