"""Conv3d_Max_LogSumExp_ReLU: conv3d through cuDNN (as eager); then one kernel reads the conv output once:
a block takes 32 pooled positions along w, its 8 warps split the channels and max-pool each channel's
window (NaN-propagating, as max_pool3d) into shared memory, and the first warp writes
relu(logsumexp over channels) (torch's formula: NaN-propagating max, an infinite max replaced by 0).
Eager writes the pooled tensor, makes five passes for logsumexp and one for relu."""
SOURCE = r"""
#include <cmath>
// y: N x C x D x H x W; out: N x 1 x Do x Ho x Wo (window k, stride s, no padding, floor)
// grid: N * Do * Ho * ceil(Wo / 32) blocks of (32, 8); dynamic shared: C * 32 floats
extern "C" __global__ void __launch_bounds__(256) pool_lse_relu(const float* __restrict__ y, float* __restrict__ out,
        int N, int C, int D, int H, int W, int Do, int Ho, int Wo, int k, int s) {
    extern __shared__ float pooled[];
    const int wblocks = (Wo + 31) / 32;
    long long b = blockIdx.x;
    const int owb = (int)(b % wblocks); b /= wblocks;
    const int oh = (int)(b % Ho); b /= Ho;
    const int od = (int)(b % Do);
    const long long n = b / Do;
    const int lane = threadIdx.x;
    const int ow = owb * 32 + lane;
    const long long S = (long long)D * H * W;
    if (ow < Wo) {
        for (int c = threadIdx.y; c < C; c += blockDim.y) {
            const float* src = y + (n * C + c) * S;
            float m = -INFINITY;
            for (int a = 0; a < k; ++a)
                for (int e = 0; e < k; ++e)
                    for (int f = 0; f < k; ++f) {
                        const float v = src[((long long)(od * s + a) * H + (oh * s + e)) * W + (ow * s + f)];
                        if (v > m || v != v) m = v;
                    }
            pooled[c * 32 + lane] = m;
        }
    }
    __syncthreads();
    if (threadIdx.y == 0 && ow < Wo) {
        float mx = -INFINITY;
        for (int c = 0; c < C; ++c) { const float v = pooled[c * 32 + lane]; if (v > mx || v != v) mx = v; }
        if (fabsf(mx) == INFINITY) mx = 0.0f;
        float se = 0.0f;
        for (int c = 0; c < C; ++c) se += expf(pooled[c * 32 + lane] - mx);
        const float r = logf(se) + mx;
        out[((n * Do + od) * Ho + oh) * (long long)Wo + ow] = (r != r) ? r : fmaxf(r, 0.0f);
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    y = F.conv3d(x, module.conv.weight, module.conv.bias, module.conv.stride, module.conv.padding,
                 module.conv.dilation, module.conv.groups)
    k = module.max_pool.kernel_size
    s = module.max_pool.stride
    assert module.max_pool.padding == 0 and module.max_pool.dilation == 1 and not module.max_pool.ceil_mode
    N, C, D, H, W = y.shape
    Do, Ho, Wo = (D - k) // s + 1, (H - k) // s + 1, (W - k) // s + 1
    out = torch.empty((N, 1, Do, Ho, Wo), dtype=y.dtype, device=y.device)
    blocks = N * Do * Ho * ((Wo + 31) // 32)
    lib.pool_lse_relu(y, out, N, C, D, H, W, Do, Ho, Wo, k, s, grid=(blocks,), block=(32, 8), shared_mem=C * 32 * 4)
    return out
