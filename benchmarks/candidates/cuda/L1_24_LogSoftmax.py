"""LogSoftmax over very long rows: eager runs one block per row; here each row is split into chunks.
Stage 1: per chunk, its max and the sum of exp(x - chunk max). Stage 2: each chunk combines its row's
partials (every block the same way) and writes x - max - log(sum). 2 reads + 1 write on every SM."""
SOURCE = r"""
#include <cmath>
extern "C" __global__ void __launch_bounds__(256) sm_partial(const float* __restrict__ x, float* __restrict__ part,
                                                            long long D, int chunk) {
    __shared__ float sh[8];
    __shared__ float mx;
    const long long row = blockIdx.y;
    const long long start = (long long)blockIdx.x * chunk, stop = min(start + chunk, D);
    const float* xr = x + row * D;
    float m = -INFINITY;
    for (long long i = start + threadIdx.x; i < stop; i += blockDim.x) m = fmaxf(m, xr[i]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) { float t = sh[0]; for (int w = 1; w < (int)(blockDim.x >> 5); ++w) t = fmaxf(t, sh[w]); mx = t; }
    __syncthreads();
    m = mx;
    float s = 0.0f;
    for (long long i = start + threadIdx.x; i < stop; i += blockDim.x) s += expf(xr[i] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += sh[w];
        part[(row * gridDim.x + blockIdx.x) * 2] = m;
        part[(row * gridDim.x + blockIdx.x) * 2 + 1] = t;
    }
}

extern "C" __global__ void __launch_bounds__(256) sm_apply(const float* __restrict__ x, const float* __restrict__ part,
        float* __restrict__ y, long long D, int chunk, int log_out) {
    __shared__ float stat[2];
    const long long row = blockIdx.y;
    if (threadIdx.x == 0) {
        float M = -INFINITY;
        for (int k = 0; k < (int)gridDim.x; ++k) M = fmaxf(M, part[(row * gridDim.x + k) * 2]);
        float S = 0.0f;
        for (int k = 0; k < (int)gridDim.x; ++k) S += part[(row * gridDim.x + k) * 2 + 1] * expf(part[(row * gridDim.x + k) * 2] - M);
        stat[0] = M;
        stat[1] = S;
    }
    __syncthreads();
    const float M = stat[0], S = stat[1], lS = logf(S);
    const long long start = (long long)blockIdx.x * chunk, stop = min(start + chunk, D);
    for (long long i = start + threadIdx.x; i < stop; i += blockDim.x) {
        const float v = x[row * D + i] - M;
        y[row * D + i] = log_out ? v - lS : expf(v) / S;
    }
}
"""
SHAPE_GENERIC = True
CHUNK = 16384


def forward(module, x):
    xc = x.contiguous()
    assert xc.dim() == 2 and module.dim in (1, -1)
    rows, D = xc.shape[0], xc.shape[1]
    chunks = (D + CHUNK - 1) // CHUNK
    part = torch.empty(rows * chunks * 2, dtype=torch.float32, device=xc.device)
    y = torch.empty_like(xc)
    lib.sm_partial(xc, part, D, CHUNK, grid=(chunks, rows), block=(256,))
    lib.sm_apply(xc, part, y, D, CHUNK, 1, grid=(chunks, rows), block=(256,))
    return y
