"""Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum: conv3d through cuDNN (as eager); then one block per
(sample, channel) reads its plane once and averages the k-window maxima of y / divisor, and a second
tiny kernel adds the bias and sums over channels in a fixed order (deterministic)."""
SOURCE = r"""
#include <cmath>
extern "C" __global__ void __launch_bounds__(256) pooled_mean(const float* __restrict__ y, double* __restrict__ m,
        int D, int H, int W, int Do, int Ho, int Wo, int kd, int kh, int kw, float div) {
    __shared__ double sh[8];
    const long long plane = blockIdx.x;
    const float* src = y + plane * D * H * W;
    const int total = Do * Ho * Wo;
    double s = 0.0;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int ow = i % Wo, oh = (i / Wo) % Ho, od = i / (Wo * Ho);
        float best = -INFINITY;
        for (int a = 0; a < kd; ++a)
            for (int b = 0; b < kh; ++b)
                for (int e = 0; e < kw; ++e) {
                    const float v = src[((long long)(od * kd + a) * H + (oh * kh + b)) * W + (ow * kw + e)] / div;
                    if (v > best || v != v) best = v;
                }
        s += best;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += sh[w];
        m[plane] = t / total;
    }
}

extern "C" __global__ void bias_sum(const double* __restrict__ m, const float* __restrict__ bias, float* __restrict__ out,
                                    int N, int C) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float s = 0.0f;
    for (int c = 0; c < C; ++c) s += (float)m[(long long)n * C + c] + bias[c];
    out[n] = s;
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    y = F.conv3d(x, module.conv.weight, module.conv.bias, module.conv.stride, module.conv.padding,
                 module.conv.dilation, module.conv.groups)
    kd, kh, kw = module.max_pool.kernel_size
    assert (kd, kh, kw) == module.max_pool.stride and module.max_pool.padding == 0
    assert module.max_pool.dilation == 1 and not module.max_pool.ceil_mode and module.sum_dim == 1
    N, C, D, H, W = y.shape
    Do, Ho, Wo = D // kd, H // kh, W // kw
    m = torch.empty(N * C, dtype=torch.float64, device=y.device)
    lib.pooled_mean(y, m, D, H, W, Do, Ho, Wo, kd, kh, kw, float(module.divisor), grid=(N * C,), block=(256,))
    out = torch.empty((N, 1, 1, 1), dtype=y.dtype, device=y.device)
    lib.bias_sum(m, module.bias, out, N, C, grid=((N + 127) // 128,), block=(128,))
    return out
