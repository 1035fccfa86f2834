"""Conv2d_Subtract_HardSwish_MaxPool_Mish: conv2d through cuDNN (as eager), then subtract, hardswish,
2-D max pooling and mish in one kernel: the conv output is read once, only the pooled result written."""
SOURCE = r"""
#include <cmath>
__device__ __forceinline__ float ma_hardswish(float x) { return x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f; }
__device__ __forceinline__ float ma_mish(float x) { return x * tanhf(log1pf(expf(x))); }

// y (P planes of H x W) -> out (P planes of Ho x Wo), window k x k, stride k (floor mode, no padding)
extern "C" __global__ void __launch_bounds__(256) sub_hs_pool_mish(const float* __restrict__ y, float* __restrict__ out,
        long long total, int H, int W, int Ho, int Wo, int k, float sub) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int ow = (int)(i % Wo);
        const long long t = i / Wo;
        const int oh = (int)(t % Ho);
        const long long p = t / Ho;
        const float* src = y + p * H * W + (long long)(oh * k) * W + ow * k;
        float m = -INFINITY;
        for (int a = 0; a < k; ++a)
            for (int b = 0; b < k; ++b) {
                const float v = ma_hardswish(src[a * W + b] - sub);
                if (v > m || v != v) m = v;   // max pooling propagates NaN
            }
        out[i] = ma_mish(m);
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    y = F.conv2d(x, module.conv.weight, module.conv.bias, module.conv.stride, module.conv.padding,
                 module.conv.dilation, module.conv.groups)
    k = module.pool.kernel_size
    assert k == module.pool.stride and module.pool.padding == 0 and module.pool.dilation == 1
    assert not module.pool.ceil_mode
    N, C, H, W = y.shape
    Ho, Wo = H // k, W // k
    out = torch.empty((N, C, Ho, Wo), dtype=y.dtype, device=y.device)
    total = N * C * Ho * Wo
    lib.sub_hs_pool_mish(y, out, total, H, W, Ho, Wo, k, float(module.subtract_value),
                         grid=(min((total + 255) // 256, 132 * 32),), block=(256,))
    return out
