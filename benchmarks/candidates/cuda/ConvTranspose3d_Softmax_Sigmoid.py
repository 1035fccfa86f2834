"""ConvTranspose3d_Softmax_Sigmoid: conv_transpose3d through cuDNN (as eager); then one kernel reads each
spatial position's channel column once (held in registers) and writes sigmoid(softmax over channels),
with torch's softmax formula (max, sum of exp(x - max) in float, exp(x - max) / sum). Eager's
channel softmax reads the tensor at least twice and writes it, then sigmoid reads and writes it again."""
SOURCE = r"""
#include <cmath>
#define MAXC 64
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

// y, out: N x C x S
extern "C" __global__ void __launch_bounds__(256) softmax_sigmoid(const float* __restrict__ y, float* __restrict__ out,
        int N, int C, long long S) {
    const long long total = (long long)N * S;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long n = i / S;
        const long long off = n * C * S + (i - n * S);
        const float* p = y + off;
        float* q = out + off;
        float mx = -INFINITY, se = 0.0f;
        if (C <= MAXC) {
            float v[MAXC];
#pragma unroll
            for (int c = 0; c < MAXC; ++c) if (c < C) { v[c] = p[c * S]; mx = fmaxf(mx, v[c]); }
#pragma unroll
            for (int c = 0; c < MAXC; ++c) if (c < C) se += expf(v[c] - mx);
#pragma unroll
            for (int c = 0; c < MAXC; ++c) if (c < C) q[c * S] = sigm(expf(v[c] - mx) / se);
        } else {
            for (int c = 0; c < C; ++c) mx = fmaxf(mx, p[c * S]);
            for (int c = 0; c < C; ++c) se += expf(p[c * S] - mx);
            for (int c = 0; c < C; ++c) q[c * S] = sigm(expf(p[c * S] - mx) / se);
        }
    }
}
"""
SHAPE_GENERIC = True


def forward(module, x):
    y = F.conv_transpose3d(x, module.conv_transpose.weight, module.conv_transpose.bias, module.conv_transpose.stride,
                           module.conv_transpose.padding, module.conv_transpose.output_padding,
                           module.conv_transpose.groups, module.conv_transpose.dilation)
    assert module.softmax.dim == 1
    N, C = y.shape[0], y.shape[1]
    S = y.numel() // max(N * C, 1)
    out = torch.empty_like(y)
    total = N * S
    lib.softmax_sigmoid(y, out, N, C, S, grid=(max(1, min((total + 255) // 256, 132 * 16)),), block=(256,))
    return out
