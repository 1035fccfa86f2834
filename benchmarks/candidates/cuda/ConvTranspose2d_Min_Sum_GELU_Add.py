"""ConvTranspose2d_Min_Sum_GELU_Add: conv_transpose2d through cuDNN, channels-last (its NHWC kernels beat
the NCHW ones eager gets: docs/cuda/h100_conv_layout_run1.txt); then one read of the conv output: a warp
per (image, column, chunk of rows) takes the NaN-propagating min over each pixel's contiguous channels and
accumulates it down the chunk (double; chunks combined in a fixed order: deterministic); a tiny kernel
applies exact GELU and the bias. Eager's min writes values and int64 indices, then three more launches.
The NCHW kernel remains for a conv output cuDNN returns in NCHW."""
SOURCE = r"""
#include <cmath>
__device__ __forceinline__ float min_nan(float m, float v) { return (v < m || v != v) ? v : m; }

// y channels-last: N x H x W x C4 float4; one warp per (n, chunk k, column w), writing part[(n * chunks + k) * W + w]
extern "C" __global__ void __launch_bounds__(256) min_colsum_nhwc(const float4* __restrict__ y, double* __restrict__ part,
        int N, int H, int W, int C4, int rows_per_chunk) {
    const int lane = threadIdx.x & 31;
    const int chunks = (H + rows_per_chunk - 1) / rows_per_chunk;
    const long long gw = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    if (gw >= (long long)N * chunks * W) return;  // uniform across the warp
    const int w = (int)(gw % W);
    const long long nk = gw / W;
    const int k = (int)(nk % chunks), n = (int)(nk / chunks);
    const int r1 = min((k + 1) * rows_per_chunk, H);
    double acc = 0.0;
    for (int h = k * rows_per_chunk; h < r1; ++h) {
        const float4* p = y + (((long long)n * H + h) * W + w) * C4;
        float m = INFINITY;
        for (int c = lane; c < C4; c += 32) {
            const float4 v = p[c];
            m = min_nan(min_nan(min_nan(min_nan(m, v.x), v.y), v.z), v.w);
        }
        for (int o = 16; o > 0; o >>= 1) m = min_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
        acc += (double)m;
    }
    if (lane == 0) part[nk * W + w] = acc;
}

// y: N x C x H x W; block (32, 8) covers 32 columns; grid (N * ceil(W / 32), row chunks)
// part[(n * chunks + k) * W + w] = sum over rows of chunk k of min_c y[n, c, h, w]
extern "C" __global__ void __launch_bounds__(256) min_colsum(const float* __restrict__ y, double* __restrict__ part,
        int N, int C, int H, int W, int rows_per_chunk) {
    __shared__ double sh[8][33];
    const int wblocks = (W + 31) / 32;
    const int n = blockIdx.x / wblocks;
    const int w = (blockIdx.x % wblocks) * 32 + threadIdx.x;
    const int r0 = blockIdx.y * rows_per_chunk, r1 = min(r0 + rows_per_chunk, H);
    const long long HW = (long long)H * W;
    double acc = 0.0;
    if (w < W) {
        const float* base = y + (long long)n * C * HW + w;
        for (int h = r0 + threadIdx.y; h < r1; h += blockDim.y) {
            const float* p = base + (long long)h * W;
            float m = p[0];
            for (int c = 1; c < C; ++c) m = min_nan(m, p[c * HW]);
            acc += (double)m;
        }
    }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && w < W) {
        double t = 0.0;
        for (int j = 0; j < (int)blockDim.y; ++j) t += sh[j][threadIdx.x];
        part[((long long)n * gridDim.y + blockIdx.y) * W + w] = t;
    }
}

extern "C" __global__ void gelu_bias(const double* __restrict__ part, const float* __restrict__ bias,
        float* __restrict__ out, int N, int W, int chunks) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * W) return;
    const int n = i / W, w = i % W;
    double s = 0.0;
    for (int k = 0; k < chunks; ++k) s += part[((long long)n * chunks + k) * W + w];
    const float x = (float)s;
    const float g = x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
    out[i] = g + bias[0];
}
"""
SHAPE_GENERIC = True
ROWS = 32


def forward(module, x):
    fmt = torch.channels_last
    w = module.conv_transpose.weight.contiguous(memory_format=fmt)
    y = F.conv_transpose2d(x.contiguous(memory_format=fmt), w, module.conv_transpose.bias,
                           module.conv_transpose.stride, module.conv_transpose.padding,
                           module.conv_transpose.output_padding, module.conv_transpose.groups,
                           module.conv_transpose.dilation)
    assert module.bias.numel() == 1
    N, C, H, W = y.shape
    chunks = (H + ROWS - 1) // ROWS
    part = torch.empty(N * chunks * W, dtype=torch.float64, device=y.device)
    if C % 4 == 0 and C > 1 and y.is_contiguous(memory_format=fmt):
        warps = N * chunks * W
        lib.min_colsum_nhwc(y.permute(0, 2, 3, 1), part, N, H, W, C // 4, ROWS, grid=((warps + 7) // 8,), block=(256,))
    else:
        y = y.contiguous()
        lib.min_colsum(y, part, N, C, H, W, ROWS, grid=(N * ((W + 31) // 32), chunks), block=(32, 8))
    out = torch.empty((N, 1, 1, W), dtype=y.dtype, device=y.device)
    lib.gelu_bias(part, module.bias, out, N, W, chunks, grid=((N * W + 255) // 256,), block=(256,))
    return out
