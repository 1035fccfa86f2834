"""Conv3d_Softmax_MaxPool_MaxPool: conv3d through cuDNN (as eager), then channel softmax and the two
max poolings in one kernel. Two k-windows with stride k in a row cover a (k*k)-window with stride
k*k (floor mode drops the same tail), so each thread owns one pooled position and all channels."""
SOURCE = r"""
#include <cmath>
#define MAXC 64
extern "C" __global__ void __launch_bounds__(128) softmax_pool(const float* __restrict__ y, float* __restrict__ out,
        int N, int C, int D, int H, int W, int Do, int Ho, int Wo, int k) {
    const long long total = (long long)N * Do * Ho * Wo;
    const long long S = (long long)D * H * W;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int ow = (int)(i % Wo);
        long long t = i / Wo;
        const int oh = (int)(t % Ho);
        t /= Ho;
        const int od = (int)(t % Do);
        const int n = (int)(t / Do);
        const float* yn = y + (long long)n * C * S;
        float best[MAXC];
        for (int c = 0; c < C; ++c) best[c] = -INFINITY;
        for (int a = 0; a < k; ++a)
            for (int b = 0; b < k; ++b)
                for (int e = 0; e < k; ++e) {
                    const long long pos = ((long long)(od * k + a) * H + (oh * k + b)) * W + (ow * k + e);
                    float m = -INFINITY;
                    for (int c = 0; c < C; ++c) m = fmaxf(m, yn[c * S + pos]);
                    float s = 0.0f;
                    for (int c = 0; c < C; ++c) s += expf(yn[c * S + pos] - m);
                    for (int c = 0; c < C; ++c) {
                        const float v = expf(yn[c * S + pos] - m) / s;
                        if (v > best[c] || v != v) best[c] = v;
                    }
                }
        float* on = out + (long long)n * C * Do * Ho * Wo + ((long long)od * Ho + oh) * Wo + ow;
        for (int c = 0; c < C; ++c) on[(long long)c * Do * Ho * Wo] = best[c];
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    y = F.conv3d(x, module.conv.weight, module.conv.bias, module.conv.stride, module.conv.padding,
                 module.conv.dilation, module.conv.groups)
    k1 = module.pool1.kernel_size
    k2 = module.pool2.kernel_size
    assert k1 == k2 and k1 == module.pool1.stride and k2 == module.pool2.stride
    assert module.pool1.padding == 0 and module.pool2.padding == 0 and module.pool1.dilation == 1
    assert module.pool2.dilation == 1 and not module.pool1.ceil_mode and not module.pool2.ceil_mode
    N, C, D, H, W = y.shape
    assert C <= 64
    Do, Ho, Wo = D // k1 // k2, H // k1 // k2, W // k1 // k2
    out = torch.empty((N, C, Do, Ho, Wo), dtype=y.dtype, device=y.device)
    total = N * Do * Ho * Wo
    lib.softmax_pool(y, out, N, C, D, H, W, Do, Ho, Wo, k1 * k2, grid=(min((total + 127) // 128, 132 * 32),),
                     block=(128,))
    return out
