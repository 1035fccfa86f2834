"""Conv3d_Min_Softmax: conv3d through cuDNN (as eager); then one kernel per (sample, h, w) position takes
the NaN-propagating min over depth of every channel (held in registers) and writes the softmax over
channels (torch's formula). Eager's min writes values and int64 indices, and its channel softmax reads
that result twice and writes it."""
SOURCE = r"""
#include <cmath>
#define MAXC 64
__device__ __forceinline__ float min_nan(float m, float v) { return (v < m || v != v) ? v : m; }

// y: N x C x D x S (S = H * W); out: N x C x S
extern "C" __global__ void __launch_bounds__(256) min_softmax(const float* __restrict__ y, float* __restrict__ out,
        int N, int C, int D, int S) {
    const long long total = (long long)N * S;
    const long long DS = (long long)D * S;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long n = i / S;
        const int s = (int)(i - n * S);
        const float* p = y + n * C * DS + s;
        float* q = out + n * C * (long long)S + s;
        float mx = -INFINITY, se = 0.0f;
        if (C <= MAXC) {
            float v[MAXC];
#pragma unroll
            for (int c = 0; c < MAXC; ++c) if (c < C) {
                const float* pc = p + c * DS;
                float m = pc[0];
                for (int d = 1; d < D; ++d) m = min_nan(m, pc[(long long)d * S]);
                v[c] = m;
                mx = fmaxf(mx, m);
            }
#pragma unroll
            for (int c = 0; c < MAXC; ++c) if (c < C) se += expf(v[c] - mx);
#pragma unroll
            for (int c = 0; c < MAXC; ++c) if (c < C) q[(long long)c * S] = expf(v[c] - mx) / se;
        } else {
            for (int c = 0; c < C; ++c) {
                const float* pc = p + c * DS;
                float m = pc[0];
                for (int d = 1; d < D; ++d) m = min_nan(m, pc[(long long)d * S]);
                q[(long long)c * S] = m;   // staged in the output, rewritten below by this thread only
                mx = fmaxf(mx, m);
            }
            for (int c = 0; c < C; ++c) se += expf(q[(long long)c * S] - mx);
            for (int c = 0; c < C; ++c) q[(long long)c * S] = expf(q[(long long)c * S] - mx) / se;
        }
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    y = F.conv3d(x, module.conv.weight, module.conv.bias, module.conv.stride, module.conv.padding,
                 module.conv.dilation, module.conv.groups)
    assert module.dim == 2
    N, C, D, H, W = y.shape
    S = H * W
    out = torch.empty((N, C, H, W), dtype=y.dtype, device=y.device)
    total = N * S
    lib.min_softmax(y, out, N, C, D, S, grid=(max(1, min((total + 255) // 256, 132 * 16)),), block=(256,))
    return out
